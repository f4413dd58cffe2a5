package agent

import (
	"context"
	"testing"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agent/wire"
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
