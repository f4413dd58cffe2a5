package main

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/client"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// codeTemplate is the template kiln run uses with --lang.
const codeTemplate = "code-interpreter"

// maxCodeFile bounds the code read from a file or stdin (the API's limit).
const maxCodeFile = 1 << 20

// readCode reads the code of FILE, or of stdin for "-".
func readCode(name string, stdin io.Reader) (string, error) {
	r := stdin
	if name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return "", err
		}
		defer f.Close()
		r = f
	}
	b, err := io.ReadAll(io.LimitReader(r, maxCodeFile+1))
	if err != nil {
		return "", fmt.Errorf("reading code: %w", err)
	}
	if len(b) > maxCodeFile {
		return "", fmt.Errorf("code larger than %d bytes", maxCodeFile)
	}
	if strings.TrimSpace(string(b)) == "" {
		return "", errors.New("no code to run: the input is empty")
	}
	return string(b), nil
}

// runCode runs a file's code in the language's default context of a fresh
// sandbox (kiln run --lang).
func runCode(ctx context.Context, agent *sandbox.Agent, lang, name, code string, timeout time.Duration) error {
	pr := &codePrinter{stdout: os.Stdout, stderr: os.Stderr, dir: ".", prefix: codePrefix(name)}
	p := wire.ExecuteParams{Language: lang, Code: code, TimeoutMs: timeout.Milliseconds()}
	if _, err := agent.Execute(ctx, p, pr.event); err != nil {
		return err
	}
	return pr.exit()
}

const codeUsage = `Usage: kiln sandbox code ID [flags] [FILE|-]

Runs code in a sandbox's interpreter: in the default context of --lang, or
in --context (see POST /v1/sandboxes/{id}/contexts). Variables persist from
one run to the next in the same context. The code comes from FILE, or from
stdin without FILE or with -. Output streams as it comes; rich results print
their text, and images are saved in the current directory (their names are
printed). An exception prints its traceback and exits 1. The sandbox needs a
template with interpreters, such as code-interpreter.

Examples:
  kiln sandbox code i8cx2kq0v7n3ma5wd1ef analysis.py
  echo 'x = 41' | kiln sandbox code i8cx2kq0v7n3ma5wd1ef
  echo 'x + 1' | kiln sandbox code i8cx2kq0v7n3ma5wd1ef -
  kiln sandbox code i8cx2kq0v7n3ma5wd1ef --lang r plot.R
  kiln sandbox code i8cx2kq0v7n3ma5wd1ef --json script.py | jq .results
`

func (r *remote) sandboxCode(ctx context.Context, args []string) error {
	c := r.command("sandbox code", codeUsage)
	var req api.CodeRequest
	env := envFlag{}
	c.fs.StringVar(&req.Language, "lang", "", "`language` of the default context to run in (default python)")
	c.fs.StringVar(&req.ContextID, "context", "", "run in this context `id` instead of a language's default context")
	c.fs.Var(env, "env", "environment variable `KEY=VALUE` for this run (repeatable)")
	timeout := c.fs.Duration("timeout", 60*time.Second, "interrupt the code after this long (the context survives)")
	pos, err := c.parse(args, 1, 2)
	if err != nil {
		return err
	}
	name := "-"
	if len(pos) == 2 {
		name = pos[1]
	}
	if req.Code, err = readCode(name, r.stdin); err != nil {
		return err
	}
	req.Timeout = timeout.Seconds()
	if len(env) > 0 {
		req.Env = env
	}
	if *c.json {
		res, err := r.c.RunCodeJSON(ctx, pos[0], req)
		if err != nil {
			return err
		}
		if err := r.printJSON(res); err != nil {
			return err
		}
		if res.Error != nil {
			return exitError{1}
		}
		return nil
	}
	pr := &codePrinter{stdout: r.stdout, stderr: r.stderr, dir: ".", prefix: codePrefix(name)}
	if _, err := r.c.RunCode(ctx, pos[0], req, client.CodeOptions{OnEvent: func(ev api.Event) { pr.event(ev) }}); err != nil {
		return err
	}
	return pr.exit()
}

// codePrinter prints an execution's events for a terminal: output as it
// comes, results as text, images saved as files, the traceback of an
// exception.
type codePrinter struct {
	stdout, stderr io.Writer
	dir            string // where images are saved
	prefix         string // of saved images' names
	saved          int
	failed         bool
}

// imageTypes are the result types saved as files, by extension; svg is
// text, the others base64.
var imageTypes = []struct{ mime, ext string }{
	{"image/png", ".png"}, {"image/jpeg", ".jpg"}, {"image/svg+xml", ".svg"},
}

func (p *codePrinter) event(ev api.Event) error {
	switch ev.Type {
	case api.EventStdout:
		p.stdout.Write(ev.Data)
	case api.EventStderr:
		p.stderr.Write(ev.Data)
	case api.EventResult:
		if ev.Result != nil {
			p.result(*ev.Result)
		}
	case api.EventExecutionError:
		if e := ev.ExecutionError; e != nil {
			p.failed = true
			tb := strings.TrimRight(e.Traceback, "\n")
			if tb == "" {
				tb = e.Name + ": " + e.Value
			}
			fmt.Fprintln(p.stderr, tb)
		}
	}
	return nil
}

// result prints a result's text, or saves its image and prints the file's
// name.
func (p *codePrinter) result(res api.Result) {
	for _, t := range imageTypes {
		v, ok := res.Data[t.mime]
		if !ok {
			continue
		}
		name, err := p.save(t.mime, t.ext, v)
		if err != nil {
			fmt.Fprintf(p.stderr, "kiln: saving %s result: %v\n", t.mime, err)
			continue
		}
		fmt.Fprintf(p.stdout, "[%s saved to %s]\n", t.mime, name)
		return
	}
	if text, ok := res.Data["text/plain"]; ok {
		fmt.Fprintln(p.stdout, strings.TrimRight(text, "\n"))
		return
	}
	var types []string
	for k := range res.Data {
		types = append(types, k)
	}
	if len(types) > 0 {
		fmt.Fprintf(p.stdout, "[result of type %s; use --json to see it]\n", strings.Join(types, ", "))
	}
}

// save writes an image into p.dir under a name no other file has.
func (p *codePrinter) save(mime, ext, v string) (string, error) {
	b := []byte(v)
	if mime != "image/svg+xml" {
		var err error
		if b, err = base64.StdEncoding.DecodeString(v); err != nil {
			return "", fmt.Errorf("decoding base64: %w", err)
		}
	}
	for {
		p.saved++
		name := filepath.Join(p.dir, fmt.Sprintf("%s-%d%s", p.prefix, p.saved, ext))
		f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			return "", err
		}
		_, err = f.Write(b)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return name, err
	}
}

// exit is exit status 1 after an exception.
func (p *codePrinter) exit() error {
	if p.failed {
		return exitError{1}
	}
	return nil
}

// codePrefix names saved images after the code's file: analysis.py gives
// analysis-1.png; stdin gives result-1.png.
func codePrefix(name string) string {
	base := strings.TrimSuffix(filepath.Base(name), filepath.Ext(name))
	if name == "-" || base == "" || base == "." || base == string(filepath.Separator) {
		return "result"
	}
	return base
}
