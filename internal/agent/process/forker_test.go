package process

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
)

// Processes started with a PidsCgroup are born in that cgroup, under its
// limit, while the agent's own threads stay outside it.
func TestForkerStartsProcessesInTheirCgroup(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("needs root (CI=true: not skipping)")
		}
		t.Skip("needs root")
	}
	parent := "/sys/fs/cgroup/pids"
	if _, err := os.Stat(filepath.Join(parent, "cgroup.procs")); err != nil {
		t.Skip("no cgroup v1 pids hierarchy")
	}
	name := fmt.Sprintf("kiln-forker-test-%d", os.Getpid())
	dir := filepath.Join(parent, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	defer func() {
		// The forker's thread leaves the cgroup when the table closes.
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			err := os.Remove(dir)
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("removing test cgroup: %v", err)
				return
			}
		}
	}()
	os.WriteFile(filepath.Join(dir, "pids.max"), []byte("8"), 0)

	tbl := newTable(t, Options{PidsCgroup: filepath.Join(dir, "tasks")})
	defer tbl.Close(context.Background())
	_, sub, err := tbl.Start(Spec{Args: []string{"sh", "-c", "cat /proc/self/cgroup; for i in 1 2 3 4 5 6 7 8 9 10; do sleep 1 & done 2>&1; wait"}, User: self()})
	if err != nil {
		t.Fatal(err)
	}
	out, st := follow(t, sub)
	if !strings.Contains(out, "pids:/"+name) {
		t.Errorf("child's cgroups:\n%s\nwant pids:/%s", out, name)
	}
	if !strings.Contains(out, "fork") && !strings.Contains(out, "Resource temporarily unavailable") {
		t.Errorf("10 background sleeps under pids.max=8 all started (exit %+v):\n%s", st, out)
	}
	self, _ := os.ReadFile("/proc/self/cgroup")
	if strings.Contains(string(self), name) {
		t.Errorf("the agent's main thread joined the user cgroup")
	}
}

// A fork bomb started in a pids cgroup is killed, whole, once the kernel
// refuses it a fork (pids.events), and its exit reason says pids_limit,
// though its first shell returned at once.
func TestPidsLimitKillsTheBomb(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("needs root (CI=true: not skipping)")
		}
		t.Skip("needs root")
	}
	parent := "/sys/fs/cgroup/pids"
	if _, err := os.Stat(filepath.Join(parent, "cgroup.procs")); err != nil {
		t.Skip("no cgroup v1 pids hierarchy")
	}
	dir := filepath.Join(parent, fmt.Sprintf("kiln-bomb-test-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	defer func() {
		for deadline := time.Now().Add(10 * time.Second); os.Remove(dir) != nil && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
		}
	}()
	os.WriteFile(filepath.Join(dir, "pids.max"), []byte("16"), 0)
	tbl := newTable(t, Options{PidsCgroup: filepath.Join(dir, "tasks")})
	defer tbl.Close(context.Background())
	_, sub, err := tbl.Start(Spec{Args: []string{"bash", "-c", ":(){ :|:& };:"}, User: self(), Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	_, st := follow(t, sub)
	if st.Reason != api.ExitPidsLimit || !strings.Contains(st.Message, "limit is 16 tasks") {
		t.Errorf("bomb's exit: %+v; want pids_limit", st)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		cur, _ := os.ReadFile(filepath.Join(dir, "pids.current"))
		if strings.TrimSpace(string(cur)) == "1" { // the forker thread
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tasks left in the cgroup after the kill: %s", cur)
		}
	}
}
