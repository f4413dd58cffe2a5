package sandbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/sandbox/sandboxtest"
)

// A new Manager on the same state dir (kiln serve restarted after a crash)
// re-adopts running sandboxes with their processes and files.
func TestReadoptAfterRestart(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		cfg := testConfig(t)
		cfg.Adopt = true
		m1 := newManager(t, cfg)
		e := create(t, m1, sandbox.CreateOptions{Runtime: rt})
		e.Sh("echo kept > /home/user/state.txt")
		ctx, cancel := context.WithCancel(context.Background())
		pidc := make(chan int, 1)
		go e.Agent.Exec(ctx, wire.ExecParams{Cmd: "for i in $(seq 1 30); do echo tick $i; sleep 0.1; done", Tag: "ticker"}, func(ev api.Event) error {
			if ev.Type == api.EventStart {
				pidc <- ev.PID
			}
			return nil
		})
		pid := <-pidc
		m1.Close() // like a crash: the channel goes, the sandbox stays
		cancel()

		m2 := newManager(t, cfg)
		sb, err := m2.Get(context.Background(), e.SB.ID)
		if err != nil || sb.State != sandbox.StateRunning {
			t.Fatalf("after restart: %+v, %v", sb, err)
		}
		e2 := sandboxtest.Wrap(t, m2, sb, nil)
		if e2.Agent, err = m2.Agent(sb.ID); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m2.Kill(context.Background(), sb.ID) })
		if r := e2.Sh("cat /home/user/state.txt"); r.Stdout != "kept\n" {
			t.Errorf("file after restart: %q", r.Stdout)
		}
		var out strings.Builder
		actx, acancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer acancel()
		exit, err := e2.Agent.Attach(actx, wire.AttachParams{PID: pid}, func(ev api.Event) error {
			out.Write(ev.Data)
			return nil
		})
		if err != nil || exit.Code != 0 || !strings.Contains(out.String(), "tick 30\n") {
			t.Fatalf("re-attached ticker: exit %+v err %v output tail %q", exit, err, tail(out.String()))
		}
	})
}

func tail(s string) string {
	if len(s) > 200 {
		return s[len(s)-200:]
	}
	return s
}
