package sandbox_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/sandbox/sandboxtest"
)

// sleepers counts the sandbox's "sleep 600" processes.
const sleepers = `for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '^sleep 600' || true`

// A sandbox paused without its memory (PauseFiles) holds no process; its
// resume, also after a restart of kiln serve, boots it afresh on its
// files: they are kept, its processes are not, and it works as before. A
// sandbox paused with its memory can be rebooted the same way, and
// AutoPauseFiles makes the timeout pause without memory.
func TestPauseFiles(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		ctx := context.Background()
		cfg := testConfig(t)
		cfg.Adopt = true
		m1 := newManager(t, cfg)
		e := create(t, m1, sandbox.CreateOptions{Runtime: rt})
		e.Sh("echo kept > /home/user/state.txt; nohup sleep 600 >/dev/null 2>&1 &")
		if r := e.Sh(sleepers); r.Stdout != "1\n" {
			t.Fatalf("sleepers before the pause: %q", r.Stdout)
		}
		hostPid := runtimePid(t, rt, e.SB.ID)
		sb, err := m1.PauseFiles(ctx, e.SB.ID)
		if err != nil || sb.State != sandbox.StatePaused {
			t.Fatalf("PauseFiles: %+v, %v", sb, err)
		}
		if _, err := os.Stat("/proc/" + strconv.Itoa(hostPid)); err == nil {
			t.Errorf("sandbox process %d still exists while paused without memory", hostPid)
		}
		m1.Close()

		m2 := newManager(t, cfg)
		t.Cleanup(func() { m2.Kill(context.Background(), e.SB.ID) })
		if sb, err := m2.Resume(ctx, e.SB.ID); err != nil || sb.State != sandbox.StateRunning {
			t.Fatalf("resume after restart: %+v, %v", sb, err)
		}
		e2 := wrapAgent(t, m2, e.SB)
		if r := e2.Sh("cat /home/user/state.txt; echo $KILN_SANDBOX_ID; " + sleepers); r.Stdout != "kept\n"+e.SB.ID.String()+"\n0\n" {
			t.Errorf("after the reboot: %q, want the file, the id and no sleeper", r.Stdout)
		}

		// Paused with its memory, then rebooted: the same.
		e2.Sh("echo again > /home/user/state.txt; nohup sleep 600 >/dev/null 2>&1 &")
		if _, err := m2.Pause(ctx, e.SB.ID); err != nil {
			t.Fatal(err)
		}
		if sb, err := m2.Reboot(ctx, e.SB.ID); err != nil || sb.State != sandbox.StateRunning {
			t.Fatalf("Reboot: %+v, %v", sb, err)
		}
		if r := wrapAgent(t, m2, e.SB).Sh("cat /home/user/state.txt; " + sleepers); r.Stdout != "again\n0\n" {
			t.Errorf("after Reboot: %q, want the file and no sleeper", r.Stdout)
		}
		if _, err := os.Stat(filepath.Join(cfg.StateDir, e.SB.ID.String(), "checkpoint", "checkpoint.img")); err == nil {
			t.Errorf("the memory image outlived the reboot")
		}

		// The timeout of an AutoPauseFiles sandbox pauses it that way.
		// (Its timeout is cut short only once the file is written: a create
		// under load can take longer than any short timeout.)
		a := create(t, m2, sandbox.CreateOptions{Runtime: rt, AutoPause: true, AutoPauseFiles: true, Timeout: 10 * time.Minute})
		a.Sh("echo auto > /home/user/state.txt; nohup sleep 600 >/dev/null 2>&1 &")
		if _, err := m2.SetTimeout(ctx, a.SB.ID, time.Second); err != nil {
			t.Fatal(err)
		}
		waitState(t, m2, a.SB.ID, sandbox.StatePaused, 60*time.Second)
		if _, err := m2.SetTimeout(ctx, a.SB.ID, 10*time.Minute); err != nil {
			t.Fatal(err)
		}
		if _, err := m2.Resume(ctx, a.SB.ID); err != nil {
			t.Fatal(err)
		}
		if r := wrapAgent(t, m2, a.SB).Sh("cat /home/user/state.txt; " + sleepers); r.Stdout != "auto\n0\n" {
			t.Errorf("after an auto-pause without memory: %q, want the file and no sleeper", r.Stdout)
		}
	})
}

// wrapAgent is sb's environment on m with its current agent session.
func wrapAgent(t *testing.T, m *sandbox.Manager, sb sandbox.Sandbox) *env {
	t.Helper()
	a, err := m.Agent(sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	return sandboxtest.Wrap(t, m, sb, a)
}
