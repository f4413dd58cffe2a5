package tools

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/client"
	"github.com/kiln-sh/kiln/internal/errdefs"
)

const (
	// maxTimeout bounds a tool call's run, in seconds: a model waiting
	// longer than this is better served by a background command.
	maxTimeout = 600
	// maxReadFile bounds what read_file returns.
	maxReadFile = 1 << 20
	// maxText bounds each stream of text handed to the model; the middle
	// of longer output is cut.
	maxText = 64 << 10
	// maxListing bounds the entries list_files returns.
	maxListing = 500
	// maxImages bounds the images of one result.
	maxImages = 8
)

func unknownTool(name string) error {
	return fmt.Errorf("no tool named %q: %w", name, errdefs.ErrNotFound)
}

// Progress receives a running call's output as it comes (MCP progress
// notifications); the whole output is in the result all the same.
type Progress func(output string)

// Call runs the sandbox tool name with the model's JSON arguments in the
// sandbox id through c. Whatever goes wrong in the sandbox or with the
// arguments is a result with IsError set, for the model to read; the error
// is only for a name that is no sandbox tool. progress may be nil.
func Call(ctx context.Context, c *client.Client, id, name string, args json.RawMessage, progress Progress) (*api.ToolResult, error) {
	switch name {
	case "execute_python":
		var a struct {
			Code    string  `json:"code"`
			Timeout float64 `json:"timeout"`
		}
		if res := decode(args, &a, "code"); res != nil {
			return res, nil
		}
		return runCode(ctx, c, id, api.CodeRequest{Code: a.Code, Language: "python", Timeout: timeout(a.Timeout)}, progress), nil
	case "run_code":
		var a struct {
			Code      string  `json:"code"`
			Language  string  `json:"language"`
			ContextID string  `json:"context_id"`
			Timeout   float64 `json:"timeout"`
		}
		if res := decode(args, &a, "code"); res != nil {
			return res, nil
		}
		return runCode(ctx, c, id, api.CodeRequest{Code: a.Code, Language: a.Language, ContextID: a.ContextID, Timeout: timeout(a.Timeout)}, progress), nil
	case "run_command":
		var a struct {
			Command string  `json:"command"`
			Cwd     string  `json:"cwd"`
			Timeout float64 `json:"timeout"`
		}
		if res := decode(args, &a, "command"); res != nil {
			return res, nil
		}
		return runCommand(ctx, c, id, api.CommandRequest{Cmd: a.Command, Cwd: a.Cwd, Timeout: timeout(a.Timeout)}, progress), nil
	case "read_file":
		var a struct {
			Path string `json:"path"`
		}
		if res := decode(args, &a, "path"); res != nil {
			return res, nil
		}
		return readFile(ctx, c, id, a.Path), nil
	case "write_file":
		var a struct {
			Path    string  `json:"path"`
			Content *string `json:"content"`
		}
		if res := decode(args, &a, "path"); res != nil {
			return res, nil
		}
		if a.Content == nil {
			return failed("invalid arguments: content is required"), nil
		}
		fi, err := c.WriteFile(ctx, id, a.Path, strings.NewReader(*a.Content))
		if err != nil {
			return failure(err), nil
		}
		return text(fmt.Sprintf("wrote %d bytes to %s", fi.Size, fi.Path)), nil
	case "list_files":
		var a struct {
			Path string `json:"path"`
		}
		if res := decode(args, &a); res != nil {
			return res, nil
		}
		return listFiles(ctx, c, id, a.Path), nil
	case "computer":
		return computer(ctx, c, id, args), nil
	}
	return nil, unknownTool(name)
}

// decode reads a tool's arguments into v strictly (unknown fields are
// mistakes the model should hear about); the named fields must be present
// and non-empty. It returns the tool error to answer with, or nil.
func decode(args json.RawMessage, v any, required ...string) *api.ToolResult {
	if len(bytes.TrimSpace(args)) == 0 || string(bytes.TrimSpace(args)) == "null" {
		args = json.RawMessage("{}")
	}
	var m map[string]any
	if err := json.Unmarshal(args, &m); err != nil {
		return failed("invalid arguments: want a JSON object")
	}
	d := json.NewDecoder(bytes.NewReader(args))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok {
			return failed(fmt.Sprintf("invalid arguments: %s must be a %s, not %s", te.Field, kind(te.Type.Kind().String()), te.Value))
		}
		return failed("invalid arguments: " + strings.TrimPrefix(err.Error(), "json: "))
	}
	for _, f := range required {
		if s, ok := m[f].(string); !ok || strings.TrimSpace(s) == "" {
			return failed("invalid arguments: " + f + " is required")
		}
	}
	return nil
}

// kind names a Go kind as JSON does.
func kind(k string) string {
	switch {
	case k == "string", k == "bool":
		return map[string]string{"string": "string", "bool": "boolean"}[k]
	case strings.HasPrefix(k, "float"), strings.HasPrefix(k, "int"):
		return "number"
	}
	return "value of another type"
}

// timeout clamps a requested timeout to (0, maxTimeout]; 0 is the
// server's default.
func timeout(s float64) float64 { return min(max(s, 0), maxTimeout) }

func text(s string) *api.ToolResult {
	return &api.ToolResult{Content: []api.ToolContent{{Type: "text", Text: s}}}
}

func failed(s string) *api.ToolResult {
	res := text(s)
	res.IsError = true
	return res
}

// failure is a tool error for an API error: its code and message, which
// the server keeps free of host details.
func failure(err error) *api.ToolResult {
	var ce *client.Error
	if errors.As(err, &ce) {
		return failed(string(ce.Code) + ": " + ce.Message)
	}
	return failed(err.Error())
}

// clip keeps the start and end of s within maxText bytes.
func clip(s string) string {
	if len(s) <= maxText {
		return s
	}
	head, tail := s[:maxText/2], s[len(s)-maxText/2:]
	return strings.ToValidUTF8(head, "") + fmt.Sprintf("\n[... %d bytes cut ...]\n", len(s)-maxText) + strings.ToValidUTF8(tail, "")
}

// imageTypes are the MIME types models take as images.
var imageTypes = []string{"image/png", "image/jpeg", "image/gif", "image/webp"}

// runCode runs code and turns its output into content: stdout, stderr,
// each result's text or image, and the exception's traceback as an error.
func runCode(ctx context.Context, c *client.Client, id string, req api.CodeRequest, progress Progress) *api.ToolResult {
	var res *api.CodeResult
	var err error
	if progress == nil {
		res, err = c.RunCodeJSON(ctx, id, req)
	} else {
		out := func(b []byte) { progress(string(b)) }
		res, err = c.RunCode(ctx, id, req, client.CodeOptions{OnStdout: out, OnStderr: out})
	}
	if err != nil {
		return failure(err)
	}
	out := &api.ToolResult{}
	var b strings.Builder
	images := 0
	if res.Stdout != "" {
		b.WriteString(clip(res.Stdout))
	}
	if res.Stderr != "" {
		section(&b, "stderr:\n"+clip(res.Stderr))
	}
	for _, r := range res.Results {
		if i := slices.IndexFunc(imageTypes, func(t string) bool { _, ok := r.Data[t]; return ok }); i >= 0 {
			if images++; images > maxImages {
				section(&b, "["+imageTypes[i]+" image not shown: at most 8 per call]")
				continue
			}
			out.Content = append(out.Content, api.ToolContent{Type: "image", Data: r.Data[imageTypes[i]], MIMEType: imageTypes[i]})
			continue
		}
		if t, ok := r.Data["text/plain"]; ok {
			section(&b, clip(t))
			continue
		}
		for mime := range r.Data {
			section(&b, "["+mime+" result not shown]")
			break
		}
	}
	if e := res.Error; e != nil {
		out.IsError = true
		tb := strings.TrimRight(e.Traceback, "\n")
		if tb == "" || !strings.Contains(tb, e.Name) {
			tb = strings.TrimLeft(tb+"\n"+e.Name+": "+e.Value, "\n")
		}
		section(&b, clip(tb))
	}
	if b.Len() == 0 && len(out.Content) == 0 {
		b.WriteString("(no output)")
	}
	if b.Len() > 0 {
		out.Content = append([]api.ToolContent{{Type: "text", Text: b.String()}}, out.Content...)
	}
	return out
}

// section appends s to b on a new line.
func section(b *strings.Builder, s string) {
	if b.Len() > 0 && !strings.HasSuffix(b.String(), "\n") {
		b.WriteByte('\n')
	}
	b.WriteString(s)
}

func runCommand(ctx context.Context, c *client.Client, id string, req api.CommandRequest, progress Progress) *api.ToolResult {
	res, err := output(ctx, c, id, req, progress)
	if err != nil {
		return failure(err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "exit code %d", res.Exit.Code)
	if res.Exit.Message != "" {
		fmt.Fprintf(&b, " (%s)", res.Exit.Message)
	} else if res.Exit.Reason != "" && res.Exit.Reason != "exited" {
		fmt.Fprintf(&b, " (%s)", res.Exit.Reason)
	}
	if res.Stdout != "" {
		b.WriteString("\nstdout:\n" + clip(res.Stdout))
	}
	if res.Stderr != "" {
		section(&b, "stderr:\n"+clip(res.Stderr))
	}
	out := text(b.String())
	out.IsError = res.Exit.Code != 0
	return out
}

// output runs a command and collects its output, streaming it to
// progress if any.
func output(ctx context.Context, c *client.Client, id string, req api.CommandRequest, progress Progress) (*api.CommandResult, error) {
	if progress == nil {
		return c.Output(ctx, id, req)
	}
	var stdout, stderr strings.Builder // bounded by the command's output limit
	r, err := c.Run(ctx, id, req, client.RunOptions{
		OnStdout: func(b []byte) { stdout.Write(b); progress(string(b)) },
		OnStderr: func(b []byte) { stderr.Write(b); progress(string(b)) },
	})
	if err != nil {
		return nil, err
	}
	return &api.CommandResult{PID: r.PID, Stdout: stdout.String(), Stderr: stderr.String(), Exit: r.Exit}, nil
}

// capped is a writer that keeps at most max bytes and notes the excess.
type capped struct {
	buf  bytes.Buffer
	max  int
	over bool
}

func (w *capped) Write(p []byte) (int, error) {
	if room := w.max - w.buf.Len(); len(p) > room {
		w.buf.Write(p[:room])
		w.over = true
		return room, io.ErrShortWrite
	}
	return w.buf.Write(p)
}

func readFile(ctx context.Context, c *client.Client, id, path string) *api.ToolResult {
	w := &capped{max: maxReadFile}
	_, err := c.ReadFile(ctx, id, path, w)
	if w.over {
		return failed(fmt.Sprintf("%s is larger than %d bytes; read part of it with run_command (e.g. head -c)", path, maxReadFile))
	}
	if err != nil {
		return failure(err)
	}
	b := w.buf.Bytes()
	if mime := http.DetectContentType(b); slices.Contains(imageTypes, mime) {
		return &api.ToolResult{Content: []api.ToolContent{{Type: "image", Data: base64.StdEncoding.EncodeToString(b), MIMEType: mime}}}
	}
	if !utf8.Valid(b) || bytes.IndexByte(b, 0) >= 0 {
		return failed(fmt.Sprintf("%s is a binary file of %d bytes; inspect it with run_command (e.g. file, xxd)", path, len(b)))
	}
	if len(b) == 0 {
		return text("(empty file)")
	}
	return text(string(b))
}

func listFiles(ctx context.Context, c *client.Client, id, path string) *api.ToolResult {
	if path == "" {
		path = "."
	}
	list, err := c.ListFiles(ctx, id, path, 1)
	if err != nil {
		return failure(err)
	}
	if len(list) == 0 {
		return text("(empty directory)")
	}
	var b strings.Builder
	for i, f := range list {
		if i == maxListing {
			fmt.Fprintf(&b, "[... %d more entries]\n", len(list)-i)
			break
		}
		name := f.Path
		if f.Type == api.FileDir {
			name += "/"
		}
		fmt.Fprintf(&b, "%-4s %10d  %s\n", f.Type, f.Size, name)
	}
	return text(strings.TrimRight(b.String(), "\n"))
}
