package sandbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/oci"
	"github.com/kiln-sh/kiln/internal/oci/ocitest"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/sandbox/sandboxtest"
)

func requireRunsc(t *testing.T) {
	t.Helper()
	_, err := exec.LookPath("runsc")
	ocitest.Require(t, err == nil, "runsc not installed")
}

func TestFork(t *testing.T) {
	requireRunsc(t)
	cfg := testConfig(t)
	m, im := newImages(t, cfg)
	src := create(t, m, sandbox.CreateOptions{Runtime: "runsc", Metadata: map[string]string{"k": "v"}})
	ctx := context.Background()
	src.Sh("echo before > /home/user/state.txt")
	pid := startCounter(t, src)

	t0 := time.Now()
	sbs, err := im.Fork(ctx, src.SB.ID, 2, sandbox.Quota{})
	t.Logf("fork into 2: %v", time.Since(t0))
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	if len(sbs) != 2 {
		t.Fatalf("got %d forks", len(sbs))
	}
	forks := make([]*env, len(sbs))
	for i, sb := range sbs {
		if sb.State != sandbox.StateRunning || sb.ID == src.SB.ID || sb.Template != src.SB.Template ||
			sb.Metadata["k"] != "v" || sb.Limits != src.SB.Limits || sb.Reason != "" || sb.ExpiresAt.IsZero() {
			t.Errorf("fork record: %+v", sb)
		}
		a, err := m.Agent(sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		forks[i] = sandboxtest.Wrap(t, m, sb, a)
	}
	// Every copy of the counter (same pid) counts on from where it was.
	var wg sync.WaitGroup
	for _, e := range append([]*env{src}, forks...) {
		wg.Go(func() { attachCounter(t, e.Agent, pid) })
	}
	wg.Wait()
	if t.Failed() {
		return
	}

	all := append([]*env{src}, forks...)
	for i, e := range all {
		if r := e.Sh("cat /home/user/state.txt"); r.Stdout != "before\n" {
			t.Errorf("sandbox %d: file: %q", i, r.Stdout)
		}
		e.Sh(fmt.Sprintf("echo %d > /home/user/mine-%d.txt", i, i))
	}
	for i, e := range all {
		r := e.Sh("ls /home/user/")
		if want := fmt.Sprintf("mine-%d.txt\nstate.txt\n", i); r.Stdout != want {
			t.Errorf("sandbox %d sees %q, want %q", i, r.Stdout, want)
		}
		if r = e.Sh("hostname; echo $KILN_SANDBOX_ID"); r.Stdout != strings.Repeat(e.SB.ID.String()+"\n", 2) {
			t.Errorf("sandbox %d (%s): hostname and KILN_SANDBOX_ID %q", i, e.SB.ID, r.Stdout)
		}
	}
	if r := src.Sh("echo still here"); r.Stdout != "still here\n" {
		t.Errorf("source after fork: %q", r.Stdout)
	}

	for _, f := range forks {
		hostPid := runtimePid(t, "runsc", f.SB.ID)
		if err := m.Kill(ctx, f.SB.ID); err != nil {
			t.Fatalf("kill fork: %v", err)
		}
		assertNothingLeft(t, cfg, f.SB.ID, hostPid)
	}
	if r := src.Sh("cat /home/user/mine-0.txt"); r.Stdout != "0\n" {
		t.Errorf("source after killing forks: %q", r.Stdout)
	}
}

func TestForkLatency(t *testing.T) {
	requireRunsc(t)
	cfg := testConfig(t)
	cfg.Limits.DefaultSandboxTimeout = 10 * time.Minute
	m, im := newImages(t, cfg)
	src := create(t, m, sandbox.CreateOptions{Runtime: "runsc"})
	ctx := context.Background()
	for _, n := range []int{1, 4, -1, -4} { // negative: with 200 MiB in use
		if n == -1 {
			src.Sh("nohup python3 -c 'import time; b = bytearray(200 << 20); b[::4096] = b\"x\" * len(b[::4096]); time.sleep(600)' >/dev/null 2>&1 & sleep 2")
		}
		t0 := time.Now()
		sbs, err := im.Fork(ctx, src.SB.ID, max(n, -n), sandbox.Quota{})
		took := time.Since(t0)
		if err != nil {
			t.Fatalf("fork %d: %v", n, err)
		}
		t.Logf("fork count %d (200 MiB in use: %v): %v", max(n, -n), n < 0, took)
		for _, sb := range sbs {
			a, err := m.Agent(sb.ID)
			if err != nil {
				t.Fatal(err)
			}
			e := sandboxtest.Wrap(t, m, sb, a)
			if r := e.Sh("echo ok"); r.Stdout != "ok\n" {
				t.Errorf("fork %s: %q", sb.ID, r.Stdout)
			}
			if err := m.Kill(ctx, sb.ID); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func TestForkRejects(t *testing.T) {
	requireRunsc(t)
	cfg := testConfig(t)
	m, im := newImages(t, cfg)
	ctx := context.Background()
	src := create(t, m, sandbox.CreateOptions{Runtime: "runsc"})
	for _, n := range []int{0, 17, -1} {
		if _, err := im.Fork(ctx, src.SB.ID, n, sandbox.Quota{}); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("count %d: %v", n, err)
		}
	}
	if _, err := im.Fork(ctx, src.SB.ID, 2, sandbox.Quota{MaxSandboxes: 2}); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("fork past quota: %v", err)
	}
	// One fork was admitted and made, the other was not: the made one is
	// unwound, record and all.
	if got := len(m.Live()); got != 1 {
		t.Errorf("%d live sandboxes after a failed fork", got)
	}
	if recs, _, err := m.List(ctx, sandbox.Filter{}); err != nil || len(recs) != 1 {
		t.Errorf("records after a failed fork: %+v %v", recs, err)
	}
	if ents, _ := os.ReadDir(cfg.StateDir); len(ents) != 1 {
		t.Errorf("state dir after a failed fork: %v", ents)
	}
	if out := settledLoops(cfg.StateDir, 1); bytes.Count(out, []byte(cfg.StateDir)) != 1 {
		t.Errorf("loop devices after a failed fork:\n%s", out)
	}
	if r := src.Sh("echo ok"); r.Stdout != "ok\n" {
		t.Errorf("source after failed fork: %q", r.Stdout)
	}
	if _, err := exec.LookPath("runc"); err == nil {
		rc := create(t, m, sandbox.CreateOptions{Runtime: "runc"})
		if _, err := im.Fork(ctx, rc.SB.ID, 1, sandbox.Quota{}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("fork of runc sandbox: %v", err)
		}
	}
	if _, err := m.Pause(ctx, src.SB.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := im.Fork(ctx, src.SB.ID, 1, sandbox.Quota{}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("fork of paused sandbox: %v", err)
	}
}

// failingRestore is runsc whose restores succeed but report failure from
// the failAt'th on, with the ids it restored.
type failingRestore struct {
	*oci.CLI
	mu     sync.Mutex
	n      int
	failAt int
	ids    []string
}

func (f *failingRestore) Restore(ctx context.Context, id string, b *oci.Bundle, img string, io oci.IO) error {
	f.mu.Lock()
	f.n++
	fail := f.n >= f.failAt
	f.ids = append(f.ids, id)
	f.mu.Unlock()
	if err := f.CLI.Restore(ctx, id, b, img, io); err != nil {
		return err
	}
	if fail {
		return errors.New("injected restore failure")
	}
	return nil
}

// A fork that fails after some forks are up unwinds all of them and
// leaves the source running.
func TestForkFailureUnwinds(t *testing.T) {
	requireRunsc(t)
	cfg := testConfig(t)
	rts := runtimes(cfg.Config)
	fr := &failingRestore{CLI: rts["runsc"].(*oci.CLI), failAt: 3}
	rts["runsc"] = fr
	m, im, _ := newLoggedManager(t, cfg, rts)
	ctx := context.Background()
	src := create(t, m, sandbox.CreateOptions{Runtime: "runsc"})
	src.Sh("echo x > /home/user/x")
	if _, err := im.Fork(ctx, src.SB.ID, 4, sandbox.Quota{}); err == nil || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("fork with failing restores: %v", err)
	}
	if len(fr.ids) != 4 {
		t.Errorf("restored %d forks", len(fr.ids))
	}
	for _, id := range fr.ids {
		assertNothingLeft(t, cfg, sandbox.ID(id), 0)
	}
	assertOnlySource(t, m, cfg)
	if r := src.Sh("cat /home/user/x"); r.Stdout != "x\n" {
		t.Errorf("source after failed fork: %q", r.Stdout)
	}
}

// A running sandbox whose container a crash left frozen (mid pause or
// fork snapshot) is thawed when it is re-adopted, and a stale fork
// snapshot dir is removed.
func TestAdoptThawsFrozen(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		cfg := testConfig(t)
		cfg.Adopt = true
		m1 := newManager(t, cfg)
		e := create(t, m1, sandbox.CreateOptions{Runtime: rt})
		if err := runtimes(cfg.Config)[rt].(oci.Pauser).Pause(context.Background(), e.SB.ID.String()); err != nil {
			t.Fatal(err)
		}
		stale := filepath.Join(cfg.StateDir, ".fork-123")
		if err := os.MkdirAll(filepath.Join(stale, "checkpoint"), 0o700); err != nil {
			t.Fatal(err)
		}
		m1.Close()

		m2 := newManager(t, cfg)
		sb, err := m2.Get(context.Background(), e.SB.ID)
		if err != nil || sb.State != sandbox.StateRunning {
			t.Fatalf("after restart: %+v, %v", sb, err)
		}
		t.Cleanup(func() { m2.Kill(context.Background(), sb.ID) })
		e2 := sandboxtest.Wrap(t, m2, sb, nil)
		if e2.Agent, err = m2.Agent(sb.ID); err != nil {
			t.Fatal(err)
		}
		if r := e2.Sh("echo ok"); r.Stdout != "ok\n" {
			t.Errorf("after thaw: %q", r.Stdout)
		}
		if _, err := os.Stat(stale); err == nil {
			t.Errorf("stale fork dir kept")
		}
	})
}

// failingCheckpoint is runsc whose checkpoints fail once the containers
// created meanwhile (a fork's, made during the checkpoint) exist.
type failingCheckpoint struct {
	*oci.CLI
	want    int
	mu      sync.Mutex
	created []string
}

func (f *failingCheckpoint) Create(ctx context.Context, id string, b *oci.Bundle, io oci.IO) error {
	err := f.CLI.Create(ctx, id, b, io)
	f.mu.Lock()
	f.created = append(f.created, id)
	f.mu.Unlock()
	return err
}

func (f *failingCheckpoint) Checkpoint(ctx context.Context, id, dir string, leaveRunning bool) error {
	for range 600 {
		f.mu.Lock()
		n := len(f.created)
		f.mu.Unlock()
		if n >= f.want {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.New("injected checkpoint failure")
}

// A fork whose checkpoint fails after its forks' containers were created
// (they are made while the checkpoint runs) unwinds them all and leaves
// the source running.
func TestForkCheckpointFailureUnwindsCreated(t *testing.T) {
	requireRunsc(t)
	cfg := testConfig(t)
	rts := runtimes(cfg.Config)
	fc := &failingCheckpoint{CLI: rts["runsc"].(*oci.CLI), want: 3}
	rts["runsc"] = fc
	m, im, _ := newLoggedManager(t, cfg, rts)
	ctx := context.Background()
	src := create(t, m, sandbox.CreateOptions{Runtime: "runsc"})
	fc.mu.Lock()
	fc.created = nil // the source's own
	fc.mu.Unlock()
	if _, err := im.Fork(ctx, src.SB.ID, 3, sandbox.Quota{}); err == nil || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("fork with a failing checkpoint: %v", err)
	}
	if len(fc.created) != 3 {
		t.Errorf("created %d fork containers, want 3", len(fc.created))
	}
	for _, id := range fc.created {
		assertNothingLeft(t, cfg, sandbox.ID(id), 0)
	}
	assertOnlySource(t, m, cfg)
	if r := src.Sh("echo still here"); r.Stdout != "still here\n" {
		t.Errorf("source after failed fork: %q", r.Stdout)
	}
}

// assertOnlySource checks that a failed fork left only its source: one
// live sandbox, one record, one state dir.
func assertOnlySource(t *testing.T, m *sandbox.Manager, cfg sandbox.Config) {
	t.Helper()
	if got := len(m.Live()); got != 1 {
		t.Errorf("%d live sandboxes after a failed fork", got)
	}
	if recs, _, err := m.List(context.Background(), sandbox.Filter{}); err != nil || len(recs) != 1 {
		t.Errorf("records after a failed fork: %+v %v", recs, err)
	}
	if ents, _ := os.ReadDir(cfg.StateDir); len(ents) != 1 {
		t.Errorf("state dir after a failed fork: %v", ents)
	}
}
