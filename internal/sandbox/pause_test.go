package sandbox_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/sandbox/sandboxtest"
)

// counterScript prints an in-memory counter 50 times, 0.1 s apart.
const counterScript = `python3 -u -c 'import time
n = 0
for _ in range(50):
    n += 1
    print("count", n)
    time.sleep(0.1)'`

// startCounter starts counterScript in the background and returns its pid
// once it has counted a few times.
func startCounter(t *testing.T, e *env) int {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	pidc, seen, failed := make(chan int, 1), make(chan struct{}), make(chan error, 1)
	var once bool
	var out strings.Builder
	go func() {
		_, err := e.Agent.Exec(ctx, wire.ExecParams{Cmd: counterScript, Tag: "counter"}, func(ev api.Event) error {
			switch {
			case ev.Type == api.EventStart:
				pidc <- ev.PID
			case ev.Type == api.EventStdout && !once:
				out.Write(ev.Data)
				if strings.Contains(out.String(), "count 3\n") {
					once = true
					close(seen)
				}
			}
			return nil
		})
		failed <- err
	}()
	var pid int
	select {
	case pid = <-pidc:
	case err := <-failed:
		t.Fatalf("counter did not start: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("counter did not start within a minute")
	}
	select {
	case <-seen:
	case <-time.After(time.Minute):
		t.Fatal("counter did not count")
	}
	cancel() // detach; the process runs on
	return pid
}

// attachCounter re-attaches to the counter and checks that it counted to
// the end: its in-memory state survived.
func attachCounter(t *testing.T, a *sandbox.Agent, pid int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out strings.Builder
	exit, err := a.Attach(ctx, wire.AttachParams{PID: pid}, func(ev api.Event) error {
		out.Write(ev.Data)
		return nil
	})
	if err != nil || exit == nil || exit.Code != 0 || !strings.Contains(out.String(), "count 50\n") {
		t.Fatalf("re-attached counter: exit %+v err %v output tail %q", exit, err, tail(out.String()))
	}
	if strings.Count(out.String(), "count 1\n") != 1 {
		t.Errorf("counter restarted: %q", tail(out.String()))
	}
}

func TestPauseResume(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		cfg := testConfig(t)
		m := newManager(t, cfg)
		e := create(t, m, sandbox.CreateOptions{Runtime: rt})
		ctx := context.Background()
		e.Sh("echo kept > /home/user/state.txt; nohup sh -c 'while :; do date +%s%N > /tmp/tick.new && mv /tmp/tick.new /tmp/tick; sleep 0.05; done' >/dev/null 2>&1 &")
		pid := startCounter(t, e)
		hostPid := runtimePid(t, rt, e.SB.ID)

		t0 := time.Now()
		sb, err := m.Pause(ctx, e.SB.ID)
		pauseTook := time.Since(t0)
		if err != nil {
			t.Fatalf("pause: %v", err)
		}
		if sb.State != sandbox.StatePaused {
			t.Errorf("paused record: %+v", sb)
		}
		if got, _ := m.Get(ctx, e.SB.ID); got.State != sandbox.StatePaused {
			t.Errorf("Get: %s", got.State)
		}
		if _, err := m.Agent(e.SB.ID); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("Agent of paused sandbox: %v", err)
		}
		if _, err := m.Pause(ctx, e.SB.ID); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("pausing twice: %v", err)
		}
		if rt == "runsc" {
			// Checkpointed: the sandbox's processes and cgroups are gone.
			time.Sleep(100 * time.Millisecond)
			if _, err := os.Stat("/proc/" + strconv.Itoa(hostPid)); err == nil {
				t.Errorf("sandbox process %d still exists while paused", hostPid)
			}
			if _, err := os.Stat(filepath.Join("/sys/fs/cgroup/memory/kiln", e.SB.ID.String())); err == nil {
				t.Errorf("memory cgroup still exists while paused")
			}
		} else {
			b, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup/freezer/kiln", e.SB.ID.String(), "freezer.state"))
			if strings.TrimSpace(string(b)) != "FROZEN" {
				t.Errorf("freezer.state = %q", b)
			}
		}
		time.Sleep(500 * time.Millisecond)

		t0 = time.Now()
		sb, err = m.Resume(ctx, e.SB.ID)
		resumeTook := time.Since(t0)
		if err != nil {
			t.Fatalf("resume: %v", err)
		}
		t.Logf("%s: pause %v, resume %v", rt, pauseTook, resumeTook)
		if sb.State != sandbox.StateRunning {
			t.Errorf("resumed record: %+v", sb)
		}
		if _, err := m.Resume(ctx, e.SB.ID); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("resuming a running sandbox: %v", err)
		}
		if e.Agent, err = m.Agent(e.SB.ID); err != nil {
			t.Fatal(err)
		}
		if r := e.Sh("cat /home/user/state.txt"); r.Stdout != "kept\n" {
			t.Errorf("file after resume: %q", r.Stdout)
		}
		r1 := e.Sh("cat /tmp/tick")
		time.Sleep(300 * time.Millisecond)
		if r2 := e.Sh("cat /tmp/tick"); r1.Stdout == r2.Stdout || r1.Stdout == "" {
			t.Errorf("background loop stopped: %q then %q", r1.Stdout, r2.Stdout)
		}
		attachCounter(t, e.Agent, pid)
	})
}

// A paused sandbox survives a restart of kiln serve and resumes after it.
func TestPausedSurvivesRestart(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		cfg := testConfig(t)
		cfg.Adopt = true
		m1 := newManager(t, cfg)
		e := create(t, m1, sandbox.CreateOptions{Runtime: rt})
		e.Sh("echo kept > /home/user/state.txt")
		pid := startCounter(t, e)
		if _, err := m1.Pause(context.Background(), e.SB.ID); err != nil {
			t.Fatal(err)
		}
		m1.Close()

		m2 := newManager(t, cfg)
		t.Cleanup(func() { m2.Kill(context.Background(), e.SB.ID) })
		if sb, err := m2.Get(context.Background(), e.SB.ID); err != nil || sb.State != sandbox.StatePaused {
			t.Fatalf("after restart: %+v, %v", sb, err)
		}
		if _, err := m2.Resume(context.Background(), e.SB.ID); err != nil {
			t.Fatalf("resume after restart: %v", err)
		}
		a, err := m2.Agent(e.SB.ID)
		if err != nil {
			t.Fatal(err)
		}
		e2 := sandboxtest.Wrap(t, m2, e.SB, a)
		if r := e2.Sh("cat /home/user/state.txt"); r.Stdout != "kept\n" {
			t.Errorf("file after restart and resume: %q", r.Stdout)
		}
		attachCounter(t, a, pid)
	})
}

// A paused runsc sandbox survives a reboot of the host, which takes its
// mounts, loop devices and runtime state but keeps its files: adopt mounts
// its layer again and it resumes with its memory, processes and files.
func TestPausedSurvivesReboot(t *testing.T) {
	requireRunsc(t)
	cfg := testConfig(t)
	cfg.Adopt = true
	m1 := newManager(t, cfg)
	e := create(t, m1, sandbox.CreateOptions{Runtime: "runsc"})
	e.Sh("echo kept > /home/user/state.txt")
	pid := startCounter(t, e)
	if _, err := m1.Pause(context.Background(), e.SB.ID); err != nil {
		t.Fatal(err)
	}
	m1.Close()
	// The reboot: the sandbox's mounts go (overlay first), and with the
	// last one its autoclear loop device.
	layer := filepath.Join(cfg.StateDir, e.SB.ID.String(), "layer")
	for _, mnt := range []string{"rootfs", "layer"} {
		if out, err := exec.Command("umount", filepath.Join(layer, mnt)).CombinedOutput(); err != nil {
			t.Fatalf("umount %s: %v %s", mnt, err, out)
		}
	}

	m2 := newManager(t, cfg)
	t.Cleanup(func() { m2.Kill(context.Background(), e.SB.ID) })
	if sb, err := m2.Get(context.Background(), e.SB.ID); err != nil || sb.State != sandbox.StatePaused {
		t.Fatalf("after reboot: %+v, %v", sb, err)
	}
	if _, err := m2.Resume(context.Background(), e.SB.ID); err != nil {
		t.Fatalf("resume after reboot: %v", err)
	}
	a, err := m2.Agent(e.SB.ID)
	if err != nil {
		t.Fatal(err)
	}
	e2 := sandboxtest.Wrap(t, m2, e.SB, a)
	if r := e2.Sh("cat /home/user/state.txt; echo new > /home/user/new.txt && cat /home/user/new.txt"); r.Stdout != "kept\nnew\n" {
		t.Errorf("files after reboot and resume: %q", r.Stdout)
	}
	attachCounter(t, a, pid)
}

func TestPauseFailures(t *testing.T) {
	_, err := exec.LookPath("runsc")
	if err != nil {
		t.Skip("runsc not installed")
	}
	cfg := testConfig(t)
	m := newManager(t, cfg)
	ctx := context.Background()

	t.Run("unknown", func(t *testing.T) {
		id := sandbox.NewID()
		if _, err := m.Pause(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("pause: %v", err)
		}
		if _, err := m.Resume(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("resume: %v", err)
		}
	})
	t.Run("kill paused", func(t *testing.T) {
		e := create(t, m, sandbox.CreateOptions{Runtime: "runsc"})
		if _, err := m.Pause(ctx, e.SB.ID); err != nil {
			t.Fatal(err)
		}
		if err := m.Kill(ctx, e.SB.ID); err != nil {
			t.Fatal(err)
		}
		assertNothingLeft(t, cfg, e.SB.ID, 0)
		if _, err := m.Resume(ctx, e.SB.ID); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("resume of killed sandbox: %v", err)
		}
	})
	for _, tc := range []struct {
		name   string
		damage func(img string) error
		want   string
	}{
		{"missing image", os.RemoveAll, "checkpoint image is missing"},
		{"corrupt image", func(img string) error {
			return os.WriteFile(filepath.Join(img, "checkpoint.img"), []byte("not an image"), 0o600)
		}, "restoring container"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := create(t, m, sandbox.CreateOptions{Runtime: "runsc"})
			if _, err := m.Pause(ctx, e.SB.ID); err != nil {
				t.Fatal(err)
			}
			if err := tc.damage(filepath.Join(cfg.StateDir, e.SB.ID.String(), "checkpoint")); err != nil {
				t.Fatal(err)
			}
			_, err := m.Resume(ctx, e.SB.ID)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("resume: %v, want %q", err, tc.want)
			}
			sb, err := m.Get(ctx, e.SB.ID)
			if err != nil || sb.State != sandbox.StateFailed || !strings.Contains(sb.Reason, tc.want) {
				t.Errorf("after failed resume: %+v, %v", sb, err)
			}
			assertNothingLeft(t, cfg, e.SB.ID, 0)
		})
	}
	t.Run("disk full", func(t *testing.T) {
		e := create(t, m, sandbox.CreateOptions{Runtime: "runsc"})
		img := filepath.Join(cfg.StateDir, e.SB.ID.String(), "checkpoint")
		if err := os.Mkdir(img, 0o700); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", img).CombinedOutput(); err != nil {
			t.Fatalf("mount: %v %s", err, out)
		}
		unmounted := false
		unmount := func() {
			if !unmounted {
				out, err := exec.Command("umount", "-l", img).CombinedOutput()
				if err != nil {
					t.Errorf("umount: %v %s", err, out)
				}
				unmounted = err == nil
			}
		}
		t.Cleanup(unmount) // before the kill; lazy: the sentry may keep the failed image open
		_, err := m.Pause(ctx, e.SB.ID)
		if !errors.Is(err, errdefs.ErrResourceExhausted) {
			t.Fatalf("pause with a full disk: %v, want resource exhausted", err)
		}
		if sb, _ := m.Get(ctx, e.SB.ID); sb.State != sandbox.StateRunning {
			t.Errorf("state after failed pause: %s", sb.State)
		}
		if e.Agent, err = m.Agent(e.SB.ID); err != nil {
			t.Fatal(err)
		}
		if r := e.Sh("echo alive"); r.Stdout != "alive\n" {
			t.Errorf("after failed pause: %q", r.Stdout)
		}
		unmount()
		if _, err := m.Pause(ctx, e.SB.ID); err != nil {
			t.Fatalf("pause with room: %v", err)
		}
		if _, err := m.Resume(ctx, e.SB.ID); err != nil {
			t.Fatalf("resume: %v", err)
		}
	})
}
