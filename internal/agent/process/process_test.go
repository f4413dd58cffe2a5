package process

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
)

func newTable(t *testing.T, o Options) *Table {
	t.Helper()
	o.Log = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	tbl := NewTable(o)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		tbl.Close(ctx)
	})
	return tbl
}

func self() User {
	return User{Name: "root", UID: uint32(os.Getuid()), GID: uint32(os.Getgid()), Home: os.TempDir()}
}

// follow runs sub to the end and returns stdout and the exit status.
func follow(t *testing.T, sub *Subscription) (string, api.ExitStatus) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out strings.Builder
	st, err := sub.Follow(ctx, func(ev api.Event) error {
		out.Write(ev.Data)
		return nil
	})
	if err != nil {
		t.Fatalf("following: %v", err)
	}
	return out.String(), st
}

// waitOutput follows sub until its output contains s.
func waitOutput(t *testing.T, sub *Subscription, s string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out strings.Builder
	errFound := context.Canceled
	_, err := sub.Follow(ctx, func(ev api.Event) error {
		out.Write(ev.Data)
		if strings.Contains(out.String(), s) {
			return errFound
		}
		return nil
	})
	if err != errFound {
		t.Fatalf("waiting for %q: %v (output %q)", s, err, out.String())
	}
}

// The guard kills the tree with the largest RSS, marks it out_of_memory
// and leaves the others alone.
// guardTable is a table whose guard sees the memory use stored in usage,
// once: the victim's memory is then "freed".
func guardTable(t *testing.T, usage *atomic.Int64, limit int64) *Table {
	return newTable(t, Options{
		MemoryLimit: limit,
		OOMGuard:    true,
		OOMInterval: 5 * time.Millisecond,
		MemoryUsage: func() (int64, error) { return usage.Swap(0), nil },
		OOMKills:    func() (int64, bool) { return 0, false },
	})
}

func TestOOMGuard(t *testing.T) {
	var usage atomic.Int64
	const limit = 256 << 20
	tbl := guardTable(t, &usage, limit)
	small, smallSub, err := tbl.Start(Spec{Args: []string{"sleep", "100"}, User: self()})
	if err != nil {
		t.Fatal(err)
	}
	defer smallSub.Close()
	_, bigSub, err := tbl.Start(Spec{Args: []string{"sh", "-c", `x=$(head -c 40000000 /dev/zero | tr '\0' a); echo ready; sleep 100`}, User: self()})
	if err != nil {
		t.Fatal(err)
	}
	waitOutput(t, bigSub, "ready")
	time.Sleep(50 * time.Millisecond) // below the threshold: nothing happens
	if n := tbl.runningCount(); n != 2 {
		t.Fatalf("%d running before the limit", n)
	}
	usage.Store(limit - oomMargin(limit) + 1)
	_, st := follow(t, bigSub)
	if st.Reason != api.ExitOOM || st.Signal != "SIGKILL" || !strings.Contains(st.Message, "256 MiB") {
		t.Errorf("big process ended with %+v, want out_of_memory", st)
	}
	select {
	case <-small.Done():
		t.Error("the small process was killed too")
	case <-time.After(100 * time.Millisecond):
	}
}

// Under runc the kernel OOM-kills; a SIGKILL death with the cgroup's
// oom_kill counter raised is reported as out_of_memory.
func TestKernelOOM(t *testing.T) {
	var kills atomic.Int64
	tbl := newTable(t, Options{MemoryLimit: 512 << 20, OOMKills: func() (int64, bool) { return kills.Load(), true }})
	p, sub, err := tbl.Start(Spec{Args: []string{"sleep", "100"}, User: self()})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	kills.Add(1)
	if err := p.Signal("SIGKILL"); err != nil {
		t.Fatal(err)
	}
	_, st := follow(t, sub)
	if st.Reason != api.ExitOOM || st.Message != "out of memory: the sandbox's memory limit is 512 MiB" {
		t.Errorf("status = %+v", st)
	}
	// Without a raised counter, a SIGKILL is just a signal.
	p, sub2, _ := tbl.Start(Spec{Args: []string{"sleep", "100"}, User: self()})
	defer sub2.Close()
	p.Signal("KILL")
	if _, st := follow(t, sub2); st.Reason != api.ExitSignaled {
		t.Errorf("status = %+v, want signaled", st)
	}
}

// Output arriving after the process exits (from a background child still
// holding the pipe) is collected until the pipe goes idle; the exit event
// still comes last and does not wait for the child.
func TestExitWithLingeringChild(t *testing.T) {
	tbl := newTable(t, Options{})
	start := time.Now()
	_, sub, err := tbl.Start(Spec{Args: []string{"sh", "-c", "echo a; (sleep 30; echo late) & exit 7"}, User: self()})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	out, st := follow(t, sub)
	if out != "a\n" || st.Code != 7 {
		t.Errorf("output %q, status %+v", out, st)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("exit took %v: waited for the background child", d)
	}
}

func TestParseStat(t *testing.T) {
	line := "1234 (we ird) name)) S 1 1234 1234 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 100 1000000 321 18446744073709551615"
	e, ok := parseStat(1234, []byte(line))
	if !ok || e.ppid != 1 || e.pgid != 1234 || e.sid != 1234 || e.rssPages != 321 {
		t.Errorf("parsed %+v, %v", e, ok)
	}
}

func TestParseSignal(t *testing.T) {
	for in, want := range map[string]string{"SIGTERM": "SIGTERM", "term": "SIGTERM", "Kill": "SIGKILL", "SIGINT": "SIGINT"} {
		if got := parseSignal(in); got == 0 || got.String() == "" || sigName(got) != want {
			t.Errorf("parseSignal(%q) = %v", in, got)
		}
	}
	if parseSignal("NOPE") != 0 || parseSignal("") != 0 {
		t.Error("unknown signals must parse as 0")
	}
}

// Under gVisor the guard also weighs the helpers the table spawned (code
// kernels): a kernel holding the most memory as the sandbox runs out is
// killed, not the sandbox, and processes started through the API live on.
func TestOOMGuardKillsSpawnedHelper(t *testing.T) {
	var usage atomic.Int64
	const limit = 256 << 20
	tbl := guardTable(t, &usage, limit)
	small, smallSub, err := tbl.Start(Spec{Args: []string{"sleep", "100"}, User: self()})
	if err != nil {
		t.Fatal(err)
	}
	defer smallSub.Close()
	ready := filepath.Join(t.TempDir(), "ready")
	exited := make(chan syscall.WaitStatus, 1)
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	script := `x=$(head -c 40000000 /dev/zero | tr '\0' a); touch ` + ready + `; sleep 100`
	pid, err := tbl.Spawn(sh, []string{"sh", "-c", script}, &syscall.ProcAttr{Sys: &syscall.SysProcAttr{Setpgid: true}},
		func(ws syscall.WaitStatus) { exited <- ws })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-pid, syscall.SIGKILL) })
	for deadline := time.Now().Add(30 * time.Second); ; {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("helper never allocated")
		}
		time.Sleep(20 * time.Millisecond)
	}
	usage.Store(limit - oomMargin(limit) + 1)
	select {
	case ws := <-exited:
		if ws.Signal() != syscall.SIGKILL {
			t.Errorf("helper ended with %v, want SIGKILL", ws)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the guard left the helper holding the most memory")
	}
	select {
	case <-small.Done():
		t.Error("the small process was killed too")
	case <-time.After(100 * time.Millisecond):
	}
}
