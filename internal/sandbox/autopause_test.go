package sandbox_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/sandbox/sandboxtest"
)

// waitState polls a sandbox's record until it is in state want.
func waitState(t *testing.T, m *sandbox.Manager, id sandbox.ID, want sandbox.State, within time.Duration) sandbox.Sandbox {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		sb, err := m.Get(context.Background(), id)
		if err == nil && sb.State == want {
			return sb
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s did not become %s within %v: %+v %v", id, want, within, sb, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A sandbox with AutoPause is paused, not killed, when its timeout
// expires; with AutoResume the next use wakes it (once, however many callers) with its
// memory, processes and files, and its timeout starts over. It survives a
// restart of kiln serve while auto-paused.
func TestAutoPause(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		cfg := testConfig(t)
		cfg.Adopt = true
		m1 := newManager(t, cfg)
		// A minute to set up in (a 2 s timeout at create expired before
		// the counter started on a loaded host), then 2 s to live.
		e := create(t, m1, sandbox.CreateOptions{Runtime: rt, AutoPause: true, AutoResume: true, Timeout: time.Minute})
		if !e.SB.AutoPause || !e.SB.AutoResume || e.SB.Timeout != time.Minute {
			t.Errorf("record: %+v", e.SB)
		}
		e.Sh("echo kept > /home/user/state.txt")
		pid := startCounter(t, e)
		if _, err := m1.SetTimeout(context.Background(), e.SB.ID, 2*time.Second); err != nil {
			t.Fatal(err)
		}
		sb := waitState(t, m1, e.SB.ID, sandbox.StatePaused, time.Minute)
		if sb.PausedAt.IsZero() || sb.ExpiresAt.Sub(sb.PausedAt) != cfg.Limits.MaxPausedLifetime {
			t.Errorf("auto-paused record: paused at %v, expires at %v", sb.PausedAt, sb.ExpiresAt)
		}
		m1.Close()

		m2 := newManager(t, cfg)
		t.Cleanup(func() { m2.Kill(context.Background(), e.SB.ID) })
		waitState(t, m2, e.SB.ID, sandbox.StatePaused, time.Second)
		var wg sync.WaitGroup
		woken := make([]sandbox.Sandbox, 4)
		errs := make([]error, 4)
		before := time.Now()
		for i := range woken {
			wg.Go(func() { woken[i], errs[i] = m2.Wake(context.Background(), e.SB.ID) })
		}
		wg.Wait()
		for i := range woken {
			if errs[i] != nil || woken[i].State != sandbox.StateRunning {
				t.Fatalf("wake %d: %+v %v", i, woken[i], errs[i])
			}
			if !woken[i].PausedAt.IsZero() || woken[i].ExpiresAt.Before(before.Add(2*time.Second)) {
				t.Errorf("wake %d: timeout did not start over: %+v", i, woken[i])
			}
		}
		if _, err := m2.SetTimeout(context.Background(), e.SB.ID, time.Minute); err != nil {
			t.Fatal(err)
		}
		a, err := m2.Agent(e.SB.ID)
		if err != nil {
			t.Fatal(err)
		}
		e2 := sandboxtest.Wrap(t, m2, e.SB, a)
		if r := e2.Sh("cat /home/user/state.txt; echo $KILN_SANDBOX_ID"); r.Stdout != "kept\n"+e.SB.ID.String()+"\n" {
			t.Errorf("after wake: %q", r.Stdout)
		}
		attachCounter(t, a, pid)
	})
}

// A paused sandbox is deleted, image and all, once it has been paused for
// the maximum paused lifetime.
func TestPausedLifetime(t *testing.T) {
	requireRunsc(t)
	cfg := testConfig(t)
	cfg.Limits.MaxPausedLifetime = 2 * time.Second
	m := newManager(t, cfg)
	e := create(t, m, sandbox.CreateOptions{Runtime: "runsc"})
	sb, err := m.Pause(context.Background(), e.SB.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got := sb.ExpiresAt.Sub(sb.PausedAt); got != 2*time.Second {
		t.Errorf("paused sandbox expires %v after its pause", got)
	}
	// Without AutoResume, a use does not wake it.
	if sb, err := m.Wake(context.Background(), e.SB.ID); err != nil || sb.State != sandbox.StatePaused {
		t.Errorf("wake of a sandbox without auto-resume: %s %v", sb.State, err)
	}
	sb = waitState(t, m, e.SB.ID, sandbox.StateStopped, 20*time.Second)
	if sb.Reason != "paused for longer than 2s" {
		t.Errorf("reason %q", sb.Reason)
	}
	assertNothingLeft(t, cfg, e.SB.ID, 0)
}
