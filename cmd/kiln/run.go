package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/oci"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/store/sqlite"
)

const runUsage = `Usage:
  kiln run [flags] -- COMMAND [ARG...]
  kiln run [flags] SCRIPT [ARG...]
  kiln run --lang LANG [flags] FILE|-

Creates a sandbox, runs the command (or uploads and runs the script: .py
with python3, .sh with bash, .js with node, anything else directly),
streams its output, exits with its exit code and destroys the sandbox.
No server is needed.

With --lang, runs FILE's code (or stdin's, for -) in a fresh sandbox's
LANG interpreter (template code-interpreter unless --template says
otherwise): output streams, rich results print their text, images are saved
in the current directory, and an exception prints its traceback and exits 1.

Examples:
  kiln run -- python3 -c 'print(1)'
  kiln run --runtime runc --memory 256M -- bash -c 'free -m'
  kiln run --template base script.sh
  kiln run --lang python analysis.py
  kiln run --lang r - < plot.R

Flags:
`

// interpreters run scripts by file extension.
var interpreters = map[string][]string{
	".py": {"python3"}, ".sh": {"bash"}, ".bash": {"bash"}, ".js": {"node"},
}

// envFlag collects repeated KEY=VALUE flags.
type envFlag map[string]string

func (e envFlag) String() string { return "" }
func (e envFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("want KEY=VALUE, got %q", s)
	}
	e[k] = v
	return nil
}

// sizeFlag parses sizes such as 512M.
type sizeFlag struct{ v *int64 }

func (s sizeFlag) String() string {
	if s.v == nil || *s.v == 0 {
		return ""
	}
	return fmt.Sprint(*s.v)
}
func (s sizeFlag) Set(v string) error {
	n, err := config.ParseBytes(v)
	*s.v = n
	return err
}

func runCmd(ctx context.Context, cfg config.Config, log *slog.Logger, args []string) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), runUsage); fs.PrintDefaults() }
	var opts sandbox.CreateOptions
	env := envFlag{}
	fs.StringVar(&opts.Template, "template", "base", "template to create the sandbox from")
	fs.StringVar(&opts.Runtime, "runtime", cfg.Runtime, "isolation runtime: runsc (gVisor) or runc")
	fs.Float64Var(&opts.Limits.CPUs, "cpus", 0, "CPU cores (default: template or server default)")
	fs.Var(sizeFlag{&opts.Limits.MemoryBytes}, "memory", "memory limit, e.g. 512M")
	fs.Var(sizeFlag{&opts.Limits.DiskBytes}, "disk", "writable disk size, e.g. 1G")
	fs.Int64Var(&opts.Limits.Pids, "pids", 0, "maximum number of processes")
	fs.Var(env, "env", "environment variable KEY=VALUE (repeatable)")
	timeout := fs.Duration("timeout", 10*time.Minute, "kill the command (and its children) after this long")
	user := fs.String("user", wire.UserDefault, "run as user or root")
	cwd := fs.String("cwd", "", "working directory (default: the user's home)")
	lang := fs.String("lang", "", "run FILE as code in this language's interpreter (python, r, javascript, typescript, bash, go, rust, c, cpp, java)")
	fs.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "data directory (templates)")
	if err := fs.Parse(args); err != nil {
		return exitError{2}
	}
	rest := fs.Args()
	if len(rest) == 0 || (*lang != "" && len(rest) != 1) {
		fs.Usage()
		return exitError{2}
	}
	var code string
	if *lang != "" {
		if !flagSet(fs, "template") {
			opts.Template = codeTemplate
		}
		var err error
		if code, err = readCode(rest[0], os.Stdin); err != nil {
			return err
		}
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	opts.Env = env

	m, _, _, closeManager, err := privateManager(ctx, cfg, log, "run-")
	if err != nil {
		return err
	}
	defer closeManager()
	sb, err := m.Create(ctx, opts)
	if err != nil {
		return err
	}
	defer func() {
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := m.Kill(kctx, sb.ID); err != nil {
			fmt.Fprintln(os.Stderr, "kiln: destroying sandbox:", err)
		}
	}()
	agent, err := m.Agent(sb.ID)
	if err != nil {
		return err
	}

	if *lang != "" {
		return runCode(ctx, agent, *lang, rest[0], code, *timeout)
	}
	p := wire.ExecParams{Args: rest, Cwd: *cwd, User: *user, TimeoutMs: timeout.Milliseconds()}
	if i := len(args) - len(rest); i == 0 || args[i-1] != "--" {
		if p.Args, err = uploadScript(ctx, agent, *user, rest); err != nil {
			return err
		}
	}
	exit, err := agent.Exec(ctx, p, func(ev api.Event) error {
		switch ev.Type {
		case api.EventStdout:
			_, err := os.Stdout.Write(ev.Data)
			return err
		case api.EventStderr:
			_, err := os.Stderr.Write(ev.Data)
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	if exit.Message != "" {
		fmt.Fprintln(os.Stderr, "kiln:", exit.Message)
	} else if exit.Reason != api.ExitNormal {
		fmt.Fprintln(os.Stderr, "kiln: command ended:", exit.Reason)
	}
	if exit.Code != 0 {
		return exitError{exit.Code}
	}
	return nil
}

// flagSet reports whether the flag name was given.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// uploadScript copies the script into the sandbox and returns the argv
// that runs it.
func uploadScript(ctx context.Context, agent *sandbox.Agent, user string, args []string) ([]string, error) {
	f, err := os.Open(args[0])
	if err != nil {
		return nil, err
	}
	defer f.Close()
	dst := "/tmp/" + filepath.Base(args[0])
	if _, err := agent.WriteFile(ctx, wire.WriteParams{Path: dst, User: user, Mode: 0o755}, f); err != nil {
		return nil, fmt.Errorf("uploading script: %w", err)
	}
	argv := append([]string{dst}, args[1:]...)
	if interp, ok := interpreters[filepath.Ext(dst)]; ok {
		argv = append(append([]string(nil), interp...), argv...)
	}
	return argv, nil
}

// privateManager is a Manager and its Images for one command's own
// sandboxes (kiln run, kiln bench, warm builds): a private state dir and an
// in-memory store, so it never adopts or touches a server's sandboxes;
// close removes both.
func privateManager(ctx context.Context, cfg config.Config, log *slog.Logger, prefix string) (*sandbox.Manager, *sandbox.Images, *sqlite.Store, func(), error) {
	if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil { // a new machine has none yet
		return nil, nil, nil, nil, fmt.Errorf("creating data dir: %w", err)
	}
	stateDir, err := os.MkdirTemp(cfg.DataDir, prefix)
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("creating state dir: %w", err)
	}
	st, err := sqlite.Open(ctx, sqlite.Memory)
	if err != nil {
		os.RemoveAll(stateDir)
		return nil, nil, nil, nil, err
	}
	m, err := sandbox.NewManager(ctx, sandbox.Config{Config: cfg, StateDir: stateDir, Store: st}, runtimes(ctx, cfg), log)
	if err != nil {
		st.Close()
		os.RemoveAll(stateDir)
		return nil, nil, nil, nil, err
	}
	im, err := sandbox.NewImages(ctx, m)
	if err != nil {
		m.Close()
		st.Close()
		os.RemoveAll(stateDir)
		return nil, nil, nil, nil, err
	}
	return m, im, st, func() {
		m.Close()
		st.Close()
		os.RemoveAll(stateDir)
	}, nil
}

// runtimes wires the configured OCI runtimes.
func runtimes(ctx context.Context, cfg config.Config) map[string]oci.Runtime {
	return map[string]oci.Runtime{
		"runsc": oci.Runsc(oci.Config{Binary: cfg.RunscPath, Root: filepath.Join(cfg.RunDir, "runsc"), Flags: append(oci.RunscFlags(ctx, cfg.RunscPath, cfg.RunscPlatform), cfg.RunscExtraFlags...)}),
		"runc":  oci.Runc(oci.Config{Binary: cfg.RuncPath, Root: filepath.Join(cfg.RunDir, "runc")}),
	}
}
