package sandbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/sandbox/sandboxtest"
)

// failBound is how soon a sandbox whose agent was stopped or killed must
// be failed (the default ping, 2 s × 3, detects a frozen agent in ~8 s).
const failBound = 30 * time.Second

// Code running as root in a sandbox signals PID 1, the agent, with every
// signal of the issue. A catchable one leaves the sandbox working (each
// used to stop, freeze or crash the agent, QUIT, ABRT, ILL and SEGV with
// a Go stack dump in the failure reason). SIGSTOP and SIGKILL cannot be
// caught: where the kernel delivers them to PID 1 (gVisor does; Linux
// drops them from inside the PID namespace) the sandbox must be failed
// within failBound with a short reason, and calls made meanwhile must
// end by then too, not hang until their own timeouts.
func TestSignalsToPID1(t *testing.T) {
	m := newManager(t, testConfig(t))
	forEachRuntime(t, func(t *testing.T, rt string) {
		t.Run("catchable", func(t *testing.T) {
			e := create(t, m, sandbox.CreateOptions{Runtime: rt})
			for _, sig := range []string{"TSTP", "TTIN", "TTOU", "HUP", "INT", "TERM", "QUIT", "ABRT", "ILL", "SEGV",
				"BUS", "FPE", "TRAP", "SYS", "USR1", "USR2", "PIPE", "ALRM", "XCPU", "XFSZ", "VTALRM", "IO", "PWR", "STKFLT"} {
				r, err := e.TryExec(wire.ExecParams{Cmd: "kill -" + sig + " 1 && echo sent", User: wire.UserRoot, TimeoutMs: 20_000})
				if err != nil || r.Stdout != "sent\n" {
					t.Fatalf("kill -%s 1: %q %q %v", sig, r.Stdout, r.Stderr, err)
				}
				// The agent answers, runs commands and reports running.
				if r := e.Sh("echo alive"); r.Stdout != "alive\n" {
					t.Fatalf("after SIG%s: %q", sig, r.Stdout)
				}
				if sb, err := m.Get(context.Background(), e.SB.ID); err != nil || sb.State != sandbox.StateRunning {
					t.Fatalf("after SIG%s: %+v %v", sig, sb, err)
				}
			}
		})
		for _, sig := range []string{"STOP", "KILL"} {
			t.Run(sig, func(t *testing.T) {
				e := create(t, m, sandbox.CreateOptions{Runtime: rt})
				sent := time.Now()
				// The kill's own call may never get its exit status: run
				// it, and a call made while the agent is stopped, with
				// deadlines far past the bound.
				calls := make(chan error, 2)
				go func() {
					_, err := e.TryExec(wire.ExecParams{Cmd: "kill -" + sig + " 1; sleep 1; echo after", User: wire.UserRoot})
					calls <- err
				}()
				time.Sleep(time.Second)
				go func() {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
					defer cancel()
					calls <- e.Agent.Ping(ctx)
				}()
				for i := range 2 {
					select {
					case err := <-calls:
						t.Logf("call %d ended after %s: %v", i, time.Since(sent).Round(time.Millisecond), err)
					case <-time.After(failBound - time.Since(sent)):
						t.Fatalf("a call made after SIG%s to PID 1 still hangs after %s", sig, failBound)
					}
				}
				// Either the signal did nothing (runc: the kernel protects
				// PID 1 from its namespace) and the sandbox works, or it
				// was failed, briefly.
				for {
					sb, err := m.Get(context.Background(), e.SB.ID)
					if err != nil {
						t.Fatal(err)
					}
					if sb.State == sandbox.StateFailed {
						// A stopped agent is failed by the ping, with its short
						// reason; a killed one's channel ends (its reason,
						// with the agent log's tail, is capped elsewhere).
						if strings.Contains(sb.Reason, "goroutine") || (sig == "STOP" && sb.Reason != "agent unresponsive") {
							t.Fatalf("failure reason %q: want a short one without a stack dump", sb.Reason)
						}
						t.Logf("SIG%s on %s: failed after %s: %q", sig, rt, time.Since(sent).Round(time.Millisecond), sb.Reason)
						if _, err := m.Agent(e.SB.ID); !errors.Is(err, errdefs.ErrNotFound) && !errors.Is(err, errdefs.ErrFailedPrecondition) {
							t.Fatalf("Agent of a failed sandbox: %v", err)
						}
						return
					}
					if sb.State != sandbox.StateRunning {
						t.Fatalf("after SIG%s: state %s (%q)", sig, sb.State, sb.Reason)
					}
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					err = e.Agent.Ping(ctx)
					cancel()
					if err == nil && time.Since(sent) > 10*time.Second {
						// Still answering long after the signal: delivered
						// to nobody. It must go on working.
						if r := e.Sh("echo alive"); r.Stdout != "alive\n" {
							t.Fatalf("after SIG%s: %q", sig, r.Stdout)
						}
						t.Logf("SIG%s on %s: ignored", sig, rt)
						return
					}
					if time.Since(sent) > failBound {
						t.Fatalf("SIG%s: sandbox still %s after %s, ping: %v", sig, sb.State, failBound, err)
					}
					time.Sleep(500 * time.Millisecond)
				}
			})
		}
	})
}

// A sandbox paused for far longer than the liveness ping's misses allow
// is not failed: the ping skips paused sandboxes and waits out the
// operations that freeze one (pause, fork), and the resumed sandbox and
// its forks answer.
func TestLivenessSparesPaused(t *testing.T) {
	cfg := testConfig(t)
	cfg.Liveness.Interval, cfg.Liveness.Misses = 500*time.Millisecond, 4
	m, im := newImages(t, cfg)
	forEachRuntime(t, func(t *testing.T, rt string) {
		e := create(t, m, sandbox.CreateOptions{Runtime: rt})
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if _, err := m.Pause(ctx, e.SB.ID); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Second) // 10 intervals
		if sb, err := m.Get(ctx, e.SB.ID); err != nil || sb.State != sandbox.StatePaused {
			t.Fatalf("paused sandbox: %+v %v", sb, err)
		}
		if _, err := m.Resume(ctx, e.SB.ID); err != nil {
			t.Fatal(err)
		}
		a, err := m.Agent(e.SB.ID)
		if err != nil {
			t.Fatal(err)
		}
		e = sandboxtest.Wrap(t, m, e.SB, a)
		time.Sleep(time.Second)
		if r := e.Sh("echo alive"); r.Stdout != "alive\n" {
			t.Fatalf("after resume: %q", r.Stdout)
		}
		if rt == "runsc" {
			forks, err := im.Fork(ctx, e.SB.ID, 2, sandbox.Quota{})
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range forks {
				t.Cleanup(func() { _ = m.Kill(context.Background(), f.ID) })
			}
			time.Sleep(3 * time.Second)
			for _, f := range forks {
				a, err := m.Agent(f.ID)
				if err != nil {
					t.Fatalf("fork %s: %v", f.ID, err)
				}
				if r := sandboxtest.Wrap(t, m, f, a).Sh("echo alive"); r.Stdout != "alive\n" {
					t.Fatalf("fork: %q", r.Stdout)
				}
			}
		}
		if r := e.Sh("echo alive"); r.Stdout != "alive\n" {
			t.Fatalf("after resume and fork: %q", r.Stdout)
		}
		if sb, err := m.Get(ctx, e.SB.ID); err != nil || sb.State != sandbox.StateRunning {
			t.Fatalf("resumed sandbox: %+v %v", sb, err)
		}
	})
}
