package agent

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
)

// A method that panics fails its own call with an internal error; the
// agent (PID 1 in a sandbox, whose death is the sandbox's) serves on.
func TestHandleRecoversPanics(t *testing.T) {
	h := newHarness(t)
	params, _ := json.Marshal(wire.ListParams{Path: "/"})
	// A nil stream makes list panic where it sends its first batch.
	res, err := h.srv.Handle(context.Background(), nil, wire.MethodList, params)
	if res != nil || errCode(err) != api.CodeInternal {
		t.Fatalf("panicking call: %v, %v; want an internal error", res, err)
	}
	var pong wire.Pong
	if err := h.call(wire.MethodPing, nil, &pong); err != nil || pong.Agent == "" {
		t.Fatalf("ping after the panic: %+v, %v", pong, err)
	}
}

// A context whose working directory its user may not enter is refused
// with permission_denied before any kernel starts, in every language
// (python used to panic the agent, javascript and bash answered
// unavailable), and the agent goes on serving contexts.
func TestContextCwdDenied(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("needs root (kernels run as the sandbox's user)")
		}
		t.Skip("needs root (kernels run as the sandbox's user)")
	}
	h := newCodeHarness(t)
	private := t.TempDir() // 0700, root's
	below := filepath.Join(private, "open")
	if err := os.Mkdir(below, 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		cwd  string
		want api.ErrorCode
	}{
		{"/root", api.CodePermissionDenied},
		{private, api.CodePermissionDenied},
		{below, api.CodePermissionDenied}, // open itself, under a closed parent
		{file, api.CodeInvalidArgument},
		{"/nonexistent", api.CodeNotFound},
	}
	for _, lang := range []string{"python", "javascript", "bash"} {
		t.Run(lang, func(t *testing.T) {
			for _, tt := range tests {
				var c api.Context
				err := h.call(wire.MethodContextCreate, wire.ContextParams{Language: lang, Cwd: tt.cwd, User: wire.UserDefault}, &c)
				if errCode(err) != tt.want {
					t.Errorf("cwd %s: context %+v, error %v; want %s", tt.cwd, c, err, tt.want)
				}
			}
			// The agent still serves contexts, as the user and as root.
			for _, user := range []string{wire.UserDefault, wire.UserRoot} {
				cwd := "/tmp"
				if user == wire.UserRoot {
					cwd = private
				}
				var c api.Context
				if err := h.call(wire.MethodContextCreate, wire.ContextParams{Language: lang, Cwd: cwd, User: user}, &c); err != nil {
					t.Fatalf("context as %s in %s: %v", user, cwd, err)
				}
				code := map[string]string{"python": "print(1+1)", "javascript": "console.log(1+1)", "bash": "echo $((1+1))"}[lang]
				if r := h.execute(wire.ExecuteParams{ContextID: c.ID, Code: code}); r.err != nil || r.output(api.EventStdout) != "2\n" {
					t.Fatalf("execution as %s: %+v", user, r)
				}
				_ = h.call(wire.MethodContextDelete, wire.ContextIDParams{ID: c.ID}, nil)
			}
		})
	}
}
