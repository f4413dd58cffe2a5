package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
)

// A restored agent takes the identity the host gives it: new processes
// see the new id and environment, not the ones it started with.
func TestIdentify(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.SandboxID = "sourcebox01"
		c.BaseEnv = []string{"OLD=1", "SHARED=source"}
	})
	show := `echo "$KILN_SANDBOX_ID ${OLD:-none} ${NEW:-none} $SHARED"; env | grep ^KILN_ | cut -d= -f1`
	if got := h.exec(wire.ExecParams{Cmd: show}).output(api.EventStdout); got != "sourcebox01 1 none source\nKILN_SANDBOX_ID\n" {
		t.Errorf("before identify: %q", got)
	}
	ctx := context.Background()
	p := wire.IdentifyParams{SandboxID: "forkbox02", Env: map[string]string{"NEW": "2", "SHARED": "fork"}}
	if err := h.conn.Invoke(ctx, wire.MethodIdentify, p, nil); err != nil {
		t.Fatal(err)
	}
	if got := h.exec(wire.ExecParams{Cmd: show}).output(api.EventStdout); got != "forkbox02 none 2 fork\nKILN_SANDBOX_ID\n" {
		t.Errorf("after identify: %q", got)
	}
	for _, bad := range []wire.IdentifyParams{
		{},
		{SandboxID: "x", Env: map[string]string{"KILN_OOM_GUARD": "0"}},
		{SandboxID: "x", Env: map[string]string{"A=B": "c"}},
		{SandboxID: "x\x00y"},
	} {
		if err := h.conn.Invoke(ctx, wire.MethodIdentify, bad, nil); errCode(err) != api.CodeInvalidArgument {
			t.Errorf("identify %+v: %v", bad, err)
		}
	}
	if got := h.exec(wire.ExecParams{Cmd: show}).output(api.EventStdout); got != "forkbox02 none 2 fork\nKILN_SANDBOX_ID\n" {
		t.Errorf("after refused identifies: %q", got)
	}
}

// identify's Then runs in the language's default context before anything
// sent after the call; with Wait the call returns after it, with its error.
func TestIdentifyThen(t *testing.T) {
	h := newCodeHarness(t)
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "identify-then-") // the kernel runs as the sandbox's user
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	mark := filepath.Join(dir, "then-ran")
	slow := &wire.ExecuteParams{Language: "python", Code: fmt.Sprintf("import time; time.sleep(2); open(%q, 'w').close(); step = 'then'", mark)}
	if err := h.conn.Invoke(ctx, wire.MethodIdentify, wire.IdentifyParams{SandboxID: "box1", Then: slow}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(mark); err == nil {
		t.Error("identify without Wait waited for Then")
	}
	r := h.execute(wire.ExecuteParams{Language: "python", Code: "print(step)"})
	if r.err != nil || r.output(api.EventStdout) != "then\n" {
		t.Errorf("execution after identify: %q %v", r.output(api.EventStdout), r.err)
	}

	fail := &wire.ExecuteParams{Language: "python", Code: "raise ValueError('boom')"}
	if err := h.conn.Invoke(ctx, wire.MethodIdentify, wire.IdentifyParams{SandboxID: "box1", Then: fail}, nil); err != nil {
		t.Errorf("identify without Wait reported Then's failure: %v", err)
	}
	err = h.conn.Invoke(ctx, wire.MethodIdentify, wire.IdentifyParams{SandboxID: "box1", Then: fail, Wait: true}, nil)
	if err == nil || !strings.Contains(err.Error(), "ValueError: boom") {
		t.Errorf("identify with Wait and a failing Then: %v", err)
	}
	if err := h.conn.Invoke(ctx, wire.MethodIdentify, wire.IdentifyParams{SandboxID: "box1", Then: &wire.ExecuteParams{Language: "cobol"}}, nil); errCode(err) != api.CodeInvalidArgument {
		t.Errorf("identify with Then in an unknown language: %v", err)
	}
}
