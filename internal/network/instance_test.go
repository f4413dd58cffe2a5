package network_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/network"
	"github.com/kiln-sh/kiln/internal/network/nettest"
)

// TestOneNetworkPerHostNS: a second Network in a host namespace that a
// live one uses is refused with a clear error and leaves the first's
// table alone; once the first closes, another may start; a Network in
// another namespace is unaffected.
func TestOneNetworkPerHostNS(t *testing.T) {
	w := nettest.New(t)
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	n1, err := network.New(ctx, w.Config(), log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n1.Close() })
	hasTable := func() bool {
		return exec.Command("ip", "netns", "exec", w.Host, "nft", "list", "table", "ip", "kiln").Run() == nil
	}
	_, err = network.New(ctx, w.Config(), log)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "another kiln serve") {
		t.Fatalf("second Network in the same namespace: %v, want a failed precondition naming another kiln serve", err)
	}
	if !hasTable() {
		t.Fatal("the refused Network removed the first one's table")
	}
	other := nettest.New(t)
	n2, err := network.New(ctx, other.Config(), log)
	if err != nil {
		t.Fatalf("a Network in another namespace: %v", err)
	}
	n2.Close()
	if err := n1.Close(); err != nil {
		t.Fatal(err)
	}
	n3, err := network.New(ctx, w.Config(), log)
	if err != nil {
		t.Fatalf("a Network after the first closed: %v", err)
	}
	n3.Close()
}

// TestLockOfEndedServer: a host namespace's lock that another process
// still holds after the kiln serve that took it ended (a child of a killed
// server, until its exec closes the lock) is waited for, not refused;
// the refusal names the processes that hold it.
func TestLockOfEndedServer(t *testing.T) {
	w := nettest.New(t)
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	defer func(d string) { network.LockDir = d }(network.LockDir)
	network.LockDir = t.TempDir()
	n1, err := network.New(ctx, w.Config(), log)
	if err != nil {
		t.Fatal(err)
	}
	n1.Close()
	locks, _ := filepath.Glob(filepath.Join(network.LockDir, "netns-*.lock"))
	if len(locks) != 1 {
		t.Fatalf("lock files: %v", locks)
	}
	// A pid that has ended is the recorded holder; flock(1) holds the
	// lock for 1.5 s, as a killed server's child would until its exec.
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(locks[0], []byte(strconv.Itoa(dead.Process.Pid)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	holder := exec.Command("flock", "--exclusive", locks[0], "sleep", "1.5")
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer holder.Wait()
	time.Sleep(300 * time.Millisecond) // flock(1) has it
	t0 := time.Now()
	n2, err := network.New(ctx, w.Config(), log)
	if err != nil {
		t.Fatalf("a Network whose lock's recorded holder ended: %v", err)
	}
	n2.Close()
	if d := time.Since(t0); d < 500*time.Millisecond {
		t.Errorf("got the lock after %v, while flock(1) held it", d)
	}

	// A live holder is refused at once, and named.
	holder2 := exec.Command("flock", "--exclusive", locks[0], "sleep", "30")
	if err := holder2.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { holder2.Process.Kill(); holder2.Wait() }()
	time.Sleep(300 * time.Millisecond)
	if err := os.WriteFile(locks[0], []byte(strconv.Itoa(holder2.Process.Pid)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = network.New(ctx, w.Config(), log)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), strconv.Itoa(holder2.Process.Pid)+" ") {
		t.Fatalf("a Network whose lock a live process holds: %v, want a refusal naming pid %d", err, holder2.Process.Pid)
	}
}
