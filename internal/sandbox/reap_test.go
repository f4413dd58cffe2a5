package sandbox_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/internal/sandbox"
)

// A runsc gofer that left the sandbox's cgroup and would not exit by
// itself (stopped) is still killed with its sandbox: Kill finds it by the
// pids the create learnt (runsc's state file), without reading every
// process on the host.
func TestKillReapsGoferOutsideCgroup(t *testing.T) {
	requireRunsc(t)
	cfg := testConfig(t)
	m := newManager(t, cfg)
	ctx := context.Background()
	sb, err := m.Create(ctx, sandbox.CreateOptions{Runtime: "runsc"})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(cfg.StateDir, sb.ID.String())
	gofer := 0
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && bytes.HasPrefix(b, []byte("runsc-gofer")) && bytes.Contains(b, []byte(dir)) {
			gofer, _ = strconv.Atoi(filepath.Base(filepath.Dir(p)))
		}
	}
	if gofer == 0 {
		t.Fatalf("no gofer of %s found", dir)
	}
	// Out of the sandbox's pids cgroup (where Kill looks first), and
	// stopped so that it cannot exit when its sentry does.
	if err := os.WriteFile("/sys/fs/cgroup/pids/cgroup.procs", []byte(strconv.Itoa(gofer)), 0); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(gofer, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(gofer, syscall.SIGKILL) })
	if err := m.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(gofer) + "/stat")
		if err != nil || strings.Contains(string(b), ") Z ") {
			break // gone, or a zombie for its parent to reap
		}
		if time.Now().After(deadline) {
			t.Fatalf("gofer %d outlived its sandbox: %s", gofer, b)
		}
	}
}
