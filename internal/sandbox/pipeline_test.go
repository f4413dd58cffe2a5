package sandbox_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

var errInjected = errors.New("injected fault")

// faults injects a fault at one stage of one bring-up path and records the
// sandboxes the pipeline worked on, so the test can check that each left
// nothing behind.
type faults struct {
	path, stage string
	also        [2]string // a second (path, stage) that fails: a warm path's cold fallback

	mu  sync.Mutex
	hit bool
	ids []sandbox.ID
}

func (f *faults) fn(path, stage string, id sandbox.ID) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !slices.Contains(f.ids, id) {
		f.ids = append(f.ids, id)
	}
	if path == f.path && stage == f.stage {
		f.hit = true
		return errInjected
	}
	if path == f.also[0] && stage == f.also[1] {
		return errInjected
	}
	return nil
}

// check asserts that the fault was reached, that op failed with it, and
// that every sandbox the pipeline touched left no dir, mount, loop device,
// cgroup, process, runtime state or record behind.
func (f *faults) check(t *testing.T, m *sandbox.Manager, cfg sandbox.Config, err error, keep ...sandbox.ID) {
	t.Helper()
	if !f.hit {
		t.Fatalf("the bring-up never reached %s of %s (err %v)", f.stage, f.path, err)
	}
	if !errors.Is(err, errInjected) {
		t.Fatalf("got %v, want the injected fault", err)
	}
	for _, id := range f.ids {
		if slices.Contains(keep, id) {
			continue
		}
		assertNothingLeft(t, cfg, id, 0)
		if sb, err := m.Get(context.Background(), id); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("record of %s kept: %+v (%v)", id, sb, err)
		}
	}
}

// A fault at every stage of every bring-up path (boot on both runtimes,
// warm restore, pool fill, restore of a fork's image, resume, reboot of a
// sandbox paused without memory) fails the
// operation and leaves nothing of the sandbox it was making.
func TestBringUpFaultsUnwind(t *testing.T) {
	bootStages := []string{"record", "dir", "layer", "bundle", "runtime", "connect"}
	t.Run("boot", func(t *testing.T) {
		forEachRuntime(t, func(t *testing.T, rt string) {
			cfg := testConfig(t)
			m := newManager(t, cfg)
			for _, stage := range bootStages {
				t.Run(stage, func(t *testing.T) {
					f := &faults{path: "boot", stage: stage}
					m.InjectFaults(f.fn)
					_, err := m.Create(context.Background(), sandbox.CreateOptions{Runtime: rt})
					f.check(t, m, cfg, err)
				})
			}
			m.InjectFaults(nil)
			if n := len(m.Live()); n != 0 {
				t.Errorf("%d sandboxes live after failed creates", n)
			}
		})
	})

	t.Run("warm", func(t *testing.T) {
		requireRunsc(t)
		cfg := testConfig(t)
		m, im := newImages(t, cfg)
		buildWarm(t, im)
		for _, stage := range []string{"layer", "bundle", "runtime", "connect", "identify"} {
			t.Run(stage, func(t *testing.T) {
				// The cold fallback fails too, so the create fails whole.
				f := &faults{path: "warm", stage: stage, also: [2]string{"boot", "runtime"}}
				m.InjectFaults(f.fn)
				_, err := m.Create(context.Background(), sandbox.CreateOptions{Template: codeInterpreter, Runtime: "runsc"})
				f.check(t, m, cfg, err)
			})
		}
		// A failed warm restore alone falls back to a cold boot.
		f := &faults{path: "warm", stage: "connect"}
		m.InjectFaults(f.fn)
		e := create(t, m, sandbox.CreateOptions{Template: codeInterpreter, Runtime: "runsc"})
		if !f.hit {
			t.Fatal("the warm restore was not tried")
		}
		if r := e.Sh("echo cold"); r.Stdout != "cold\n" {
			t.Errorf("sandbox booted after a failed warm restore: %q", r.Stdout)
		}
	})

	t.Run("pool", func(t *testing.T) {
		requireRunsc(t)
		cfg := testConfig(t)
		cfg.Runtime = "runsc"
		m, im := newImages(t, cfg)
		buildWarm(t, im)
		for _, fault := range [][2]string{{"pool", "dir"}, {"warm", "runtime"}, {"warm", "identify"}} {
			t.Run(fault[0]+"/"+fault[1], func(t *testing.T) {
				f := &faults{path: fault[0], stage: fault[1], also: [2]string{"boot", "connect"}}
				m.InjectFaults(f.fn)
				err := im.MakePooled(context.Background(), codeInterpreter)
				f.check(t, m, cfg, err)
			})
		}
	})

	t.Run("restore", func(t *testing.T) {
		requireRunsc(t)
		cfg := testConfig(t)
		m, im := newImages(t, cfg)
		src := create(t, m, sandbox.CreateOptions{Runtime: "runsc"})
		src.Sh("echo x > /home/user/x")
		for _, stage := range []string{"record", "dir", "layer", "bundle", "runtime", "connect", "identify"} {
			t.Run(stage, func(t *testing.T) {
				f := &faults{path: "restore", stage: stage}
				m.InjectFaults(f.fn)
				_, err := im.Fork(context.Background(), src.SB.ID, 2, sandbox.Quota{})
				f.check(t, m, cfg, err, src.SB.ID)
			})
		}
		m.InjectFaults(nil)
		if r := src.Sh("cat /home/user/x"); r.Stdout != "x\n" {
			t.Errorf("source after failed forks: %q", r.Stdout)
		}
		if n := len(m.Live()); n != 1 {
			t.Errorf("%d sandboxes live after failed forks, want the source", n)
		}
	})

	t.Run("resume", func(t *testing.T) {
		requireRunsc(t)
		cfg := testConfig(t)
		m := newManager(t, cfg)
		for _, stage := range []string{"runtime", "connect"} {
			t.Run(stage, func(t *testing.T) {
				m.InjectFaults(nil)
				e := create(t, m, sandbox.CreateOptions{Runtime: "runsc"})
				ctx := context.Background()
				if _, err := m.Pause(ctx, e.SB.ID); err != nil {
					t.Fatal(err)
				}
				f := &faults{path: "resume", stage: stage}
				m.InjectFaults(f.fn)
				_, err := m.Resume(ctx, e.SB.ID)
				if !f.hit || !errors.Is(err, errInjected) {
					t.Fatalf("resume: %v (fault reached: %v)", err, f.hit)
				}
				// A sandbox that cannot resume is failed and destroyed; its
				// record stays, with the reason.
				sb, gerr := m.Get(ctx, e.SB.ID)
				if gerr != nil || sb.State != sandbox.StateFailed {
					t.Fatalf("after a failed resume: %+v %v", sb, gerr)
				}
				assertNothingLeft(t, cfg, e.SB.ID, 0)
			})
		}
	})

	t.Run("reboot", func(t *testing.T) {
		forEachRuntime(t, func(t *testing.T, rt string) {
			cfg := testConfig(t)
			m := newManager(t, cfg)
			for _, stage := range []string{"runtime", "connect"} {
				t.Run(stage, func(t *testing.T) {
					m.InjectFaults(nil)
					e := create(t, m, sandbox.CreateOptions{Runtime: rt})
					ctx := context.Background()
					if _, err := m.PauseFiles(ctx, e.SB.ID); err != nil {
						t.Fatal(err)
					}
					f := &faults{path: "reboot", stage: stage}
					m.InjectFaults(f.fn)
					_, err := m.Resume(ctx, e.SB.ID)
					if !f.hit || !errors.Is(err, errInjected) {
						t.Fatalf("resume: %v (fault reached: %v)", err, f.hit)
					}
					if sb, gerr := m.Get(ctx, e.SB.ID); gerr != nil || sb.State != sandbox.StateFailed {
						t.Fatalf("after a failed reboot: %+v %v", sb, gerr)
					}
					assertNothingLeft(t, cfg, e.SB.ID, 0)
				})
			}
		})
	})
}
