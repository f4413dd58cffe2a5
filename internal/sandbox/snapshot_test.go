package sandbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/kiln-sh/kiln/internal/oci"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/oci/ocitest"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/sandbox/sandboxtest"
	"github.com/kiln-sh/kiln/internal/template"
)

// snapshotDir is where a test Manager keeps its snapshots.
func snapshotDir(cfg sandbox.Config) string {
	return filepath.Join(cfg.StateDir, ".snapshots")
}

// killAllOnCleanup kills whatever m runs at the end of the test (sandboxes
// re-adopted from an earlier Manager).
func killAllOnCleanup(t *testing.T, m *sandbox.Manager) {
	t.Cleanup(func() {
		for _, sb := range m.Live() {
			_ = m.Kill(context.Background(), sb.ID)
		}
	})
}

// A snapshot is taken of a running sandbox, which runs on and diverges;
// sandboxes made from it start from its memory, processes and files, with
// their own identity and env, and diverge from each other. It survives the
// kill of its source and a restart, and is deleted with its files.
func TestSnapshot(t *testing.T) {
	requireRunsc(t)
	cfg := testConfig(t)
	cfg.Adopt = true
	m1, im1 := newImages(t, cfg)
	ctx := context.Background()
	src := create(t, m1, sandbox.CreateOptions{Runtime: "runsc", Env: map[string]string{"X": "src"}, Metadata: map[string]string{"k": "v"}})
	src.Sh("echo before > /home/user/state.txt")
	pid := startCounter(t, src)

	t0 := time.Now()
	snap, err := im1.Snapshot(ctx, src.SB.ID, "s1")
	t.Logf("snapshot: %v", time.Since(t0))
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	if snap.Name != "s1" || snap.Source != src.SB.ID || snap.Template != "base" || snap.Runtime != "runsc" ||
		snap.SizeBytes <= 0 || snap.Env["X"] != "src" || snap.Limits != src.SB.Limits {
		t.Errorf("snapshot record: %+v", snap)
	}
	if _, err := os.Stat(filepath.Join(snapshotDir(cfg), snap.ID, "disk.img")); err != nil {
		t.Errorf("snapshot files: %v", err)
	}
	if r := src.Sh("echo after > /home/user/state.txt; echo running"); r.Stdout != "running\n" {
		t.Errorf("source after snapshot: %q", r.Stdout)
	}

	t0 = time.Now()
	a := create(t, m1, sandbox.CreateOptions{Snapshot: "s1", Env: map[string]string{"X": "a"}})
	t.Logf("create from snapshot: %v", time.Since(t0))
	b := create(t, m1, sandbox.CreateOptions{Snapshot: "s1", AutoPause: true})
	var wg sync.WaitGroup
	for _, e := range []*env{src, a, b} {
		wg.Go(func() { attachCounter(t, e.Agent, pid) })
	}
	wg.Wait()
	for _, c := range []struct {
		e *env
		x string
	}{{a, "a"}, {b, "src"}} {
		sb := c.e.SB
		if sb.Template != "base" || sb.Metadata["k"] != "v" || sb.Limits != src.SB.Limits || sb.ID == src.SB.ID {
			t.Errorf("sandbox from snapshot: %+v", sb)
		}
		want := fmt.Sprintf("before\n%s\n%s\n%s\n", c.x, sb.ID, sb.ID)
		if r := c.e.Sh("cat /home/user/state.txt; echo $X; hostname; echo $KILN_SANDBOX_ID"); r.Stdout != want {
			t.Errorf("sandbox %s from snapshot sees %q, want %q", sb.ID, r.Stdout, want)
		}
	}
	if !b.SB.AutoPause || a.SB.AutoPause {
		t.Errorf("auto_pause: %v %v", a.SB.AutoPause, b.SB.AutoPause)
	}
	a.Sh("echo a > /home/user/mine")
	if r := b.Sh("cat /home/user/mine 2>&1; cat /home/user/state.txt"); r.Stdout != "cat: /home/user/mine: No such file or directory\nbefore\n" {
		t.Errorf("sandboxes from one snapshot did not diverge: %q", r.Stdout)
	}
	if r := src.Sh("cat /home/user/state.txt; ls /home/user/mine 2>/dev/null"); r.Stdout != "after\n" {
		t.Errorf("source sees %q", r.Stdout)
	}

	// The snapshot outlives its source and a restart of kiln serve.
	if err := m1.Kill(ctx, src.SB.ID); err != nil {
		t.Fatal(err)
	}
	m1.Close()
	m2, im2 := newImages(t, cfg)
	killAllOnCleanup(t, m2)
	snaps, err := im2.Snapshots(ctx, "")
	if err != nil || len(snaps) != 1 || snaps[0].ID != snap.ID {
		t.Fatalf("snapshots after restart: %+v %v", snaps, err)
	}
	c := create(t, m2, sandbox.CreateOptions{Snapshot: "s1"})
	if r := c.Sh("cat /home/user/state.txt"); r.Stdout != "before\n" {
		t.Errorf("sandbox from snapshot after restart: %q", r.Stdout)
	}

	if err := im2.DeleteSnapshot(ctx, "", "s1"); err != nil {
		t.Fatal(err)
	}
	if _, err := im2.GetSnapshot(ctx, "", "s1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("deleted snapshot: %v", err)
	}
	// Its files go in the background.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ents, _ := os.ReadDir(snapshotDir(cfg))
		if len(ents) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("deleted snapshot's files: %v", ents)
			break
		}
	}
	if _, err := m2.Create(ctx, sandbox.CreateOptions{Snapshot: "s1"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("create from deleted snapshot: %v", err)
	}
	if r := c.Sh("cat /home/user/state.txt"); r.Stdout != "before\n" {
		t.Errorf("sandbox after its snapshot was deleted: %q", r.Stdout)
	}
}

// countState counts what a Manager's state holds: live sandboxes, records,
// sandbox dirs and loop devices of its state dir.
func countState(t *testing.T, m *sandbox.Manager, cfg sandbox.Config) string {
	t.Helper()
	recs, _, err := m.List(context.Background(), sandbox.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(cfg.StateDir)
	out, _ := exec.Command("losetup", "-a").Output()
	return fmt.Sprintf("live %d, records %d, dirs %d, loops %d", len(m.Live()), len(recs), len(ents), bytes.Count(out, []byte(cfg.StateDir)))
}

// settledState is countState once it equals want, or after 10 s: the kernel
// clears an autoclear loop device only when the last holder of its mount
// (a killed runsc process, a lazy unmount) lets go.
func settledState(t *testing.T, m *sandbox.Manager, cfg sandbox.Config, want string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := countState(t, m, cfg)
		if got == want || time.Now().After(deadline) {
			return got
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Snapshots that cannot be taken or used are refused with a clear error,
// leave nothing behind, and leave the source running.
func TestSnapshotRefusals(t *testing.T) {
	requireRunsc(t)
	cfg := testConfig(t)
	cfg.Limits.MaxSnapshots = 1
	m, im := newImages(t, cfg)
	ctx := context.Background()
	src := create(t, m, sandbox.CreateOptions{Runtime: "runsc", Owner: "key_a"})
	if _, err := im.Snapshot(ctx, src.SB.ID, "../x"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("bad name: %v", err)
	}
	if _, err := im.Snapshot(ctx, src.SB.ID, "s1"); err != nil {
		t.Fatal(err)
	}
	before := countState(t, m, cfg)
	for name, want := range map[string]error{"s1": errdefs.ErrAlreadyExists, "s2": errdefs.ErrResourceExhausted} {
		if _, err := im.Snapshot(ctx, src.SB.ID, name); !errors.Is(err, want) {
			t.Errorf("snapshot %s: %v, want %v", name, err, want)
		} else {
			t.Logf("snapshot %s: %v", name, err)
		}
	}
	// Another owner sees no snapshot of key_a's.
	if _, err := im.GetSnapshot(ctx, "key_b", "s1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("other owner's get: %v", err)
	}
	for _, bad := range []struct {
		opts sandbox.CreateOptions
		want error
	}{
		{sandbox.CreateOptions{Snapshot: "s1", Owner: "key_b"}, errdefs.ErrNotFound},
		{sandbox.CreateOptions{Snapshot: "s1", Owner: "key_a", Template: "other"}, errdefs.ErrInvalidArgument},
		{sandbox.CreateOptions{Snapshot: "s1", Owner: "key_a", Runtime: "runc"}, errdefs.ErrInvalidArgument},
		{sandbox.CreateOptions{Snapshot: "s1", Owner: "key_a", Network: &sandbox.NetworkOptions{Mode: sandbox.NetworkNAT}}, errdefs.ErrInvalidArgument},
		{sandbox.CreateOptions{Snapshot: "s1", Owner: "key_a", Limits: sandbox.Limits{MemoryBytes: 1 << 30}}, errdefs.ErrInvalidArgument},
		{sandbox.CreateOptions{Snapshot: "s1", Owner: "key_a", Env: map[string]string{"KILN_X": "1"}}, errdefs.ErrInvalidArgument},
		{sandbox.CreateOptions{Snapshot: "s1", Owner: "key_a", Quota: sandbox.Quota{MaxSandboxes: 1}}, errdefs.ErrResourceExhausted},
	} {
		if _, err := m.Create(ctx, bad.opts); !errors.Is(err, bad.want) {
			t.Errorf("create %+v: %v, want %v", bad.opts, err, bad.want)
		}
	}
	if got := settledState(t, m, cfg, before); got != before {
		t.Errorf("refusals left state: %s, was %s", got, before)
	}

	// Per-owner bytes: a second owner's snapshot larger than the limit.
	cfg2 := testConfig(t)
	cfg2.Limits.MaxSnapshotBytes = 1 << 20
	m2, im2 := newImages(t, cfg2)
	src2 := create(t, m2, sandbox.CreateOptions{Runtime: "runsc"})
	if _, err := im2.Snapshot(ctx, src2.SB.ID, "big"); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("snapshot over the byte limit: %v", err)
	} else {
		t.Logf("over the byte limit: %v", err)
	}
	if ents, _ := os.ReadDir(snapshotDir(cfg2)); len(ents) != 0 {
		t.Errorf("refused snapshot left files: %v", ents)
	}

	if _, err := exec.LookPath("runc"); err == nil {
		rc := create(t, m, sandbox.CreateOptions{Runtime: "runc", Owner: "key_a"})
		if _, err := im.Snapshot(ctx, rc.SB.ID, "r"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("snapshot of runc sandbox: %v", err)
		}
	}
	if _, err := m2.Pause(ctx, src2.SB.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := im2.Snapshot(ctx, src2.SB.ID, "p"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("snapshot of paused sandbox: %v", err)
	}
	if r := src.Sh("echo ok"); r.Stdout != "ok\n" {
		t.Errorf("source after refusals: %q", r.Stdout)
	}
}

// A snapshot whose files are missing or corrupt is refused with a clear
// error and nothing half-made; at start, records without files and files
// without records are removed.
func TestSnapshotDamaged(t *testing.T) {
	requireRunsc(t)
	cfg := testConfig(t)
	cfg.Adopt = true
	m, im := newImages(t, cfg)
	ctx := context.Background()
	src := create(t, m, sandbox.CreateOptions{Runtime: "runsc"})
	var snaps []sandbox.Snapshot
	for _, name := range []string{"missing", "corrupt", "gone", "kept"} {
		s, err := im.Snapshot(ctx, src.SB.ID, name)
		if err != nil {
			t.Fatal(err)
		}
		snaps = append(snaps, s)
	}
	dir := snapshotDir(cfg)
	img := func(s sandbox.Snapshot) string { return filepath.Join(dir, s.ID, "checkpoint", "checkpoint.img") }
	if err := os.Remove(img(snaps[0])); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(img(snaps[1]))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(img(snaps[1]), bytes.Repeat([]byte("garbage!"), int(fi.Size()/8)+1), 0o600); err != nil {
		t.Fatal(err)
	}
	before := countState(t, m, cfg)
	for _, s := range snaps[:2] {
		_, err := m.Create(ctx, sandbox.CreateOptions{Snapshot: s.Name})
		if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "damaged") {
			t.Errorf("create from %s snapshot: %v", s.Name, err)
		} else {
			t.Logf("create from %s snapshot: %v", s.Name, err)
		}
	}
	if got := settledState(t, m, cfg, before); got != before {
		t.Errorf("failed creates left state: %s, was %s", got, before)
	}
	if r := src.Sh("echo ok"); r.Stdout != "ok\n" {
		t.Errorf("source: %q", r.Stdout)
	}

	// GC at start.
	if err := os.RemoveAll(filepath.Join(dir, snaps[2].ID)); err != nil {
		t.Fatal(err)
	}
	orphan := filepath.Join(dir, "orphan0000000000000")
	if err := os.MkdirAll(orphan, 0o700); err != nil {
		t.Fatal(err)
	}
	m.Close()
	m2, im2 := newImages(t, cfg)
	killAllOnCleanup(t, m2)
	var names []string
	left, _ := im2.Snapshots(ctx, "")
	for _, s := range left {
		names = append(names, s.Name)
	}
	if strings.Join(names, ",") != "missing,corrupt,kept" {
		t.Errorf("snapshots after GC: %v", names)
	}
	if _, err := os.Stat(orphan); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("orphaned snapshot dir kept: %v", err)
	}
	if _, err := m2.Create(ctx, sandbox.CreateOptions{Snapshot: "kept"}); err != nil {
		t.Errorf("create from intact snapshot after GC: %v", err)
	}
}

// pyEval runs code in a sandbox's default Python context and returns its
// result's text/plain (or the error).
func pyEval(t *testing.T, a *sandbox.Agent, code string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out strings.Builder
	_, err := a.Execute(ctx, wire.ExecuteParams{Language: "python", Code: code}, func(ev api.Event) error {
		switch {
		case ev.Type == api.EventResult && ev.Result != nil:
			out.WriteString(ev.Result.Data["text/plain"])
		case ev.Type == api.EventExecutionError && ev.ExecutionError != nil:
			out.WriteString("error: " + ev.ExecutionError.Name + ": " + ev.ExecutionError.Value)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("execute %q: %v", code, err)
	}
	return out.String()
}

// A Python kernel's variables survive into a fork and into sandboxes made
// from a snapshot, across a restart of kiln serve, and then diverge; and
// through a pause and resume.
func TestSnapshotKernelState(t *testing.T) {
	requireRunsc(t)
	cfg := testConfig(t)
	_, err := template.Lookup(cfg.DataDir, "code-interpreter")
	ocitest.Require(t, err == nil, fmt.Sprintf("code-interpreter template not built (make setup): %v", err))
	cfg.Adopt = true
	m1, im1 := newImages(t, cfg)
	ctx := context.Background()
	src := create(t, m1, sandbox.CreateOptions{Runtime: "runsc", Template: "code-interpreter"})
	if got := pyEval(t, src.Agent, "x = 41\nx"); got != "41" {
		t.Fatalf("x in source: %q", got)
	}
	if _, err := im1.Snapshot(ctx, src.SB.ID, "kernel"); err != nil {
		t.Fatal(err)
	}
	forks, err := im1.Fork(ctx, src.SB.ID, 1, sandbox.Quota{})
	if err != nil {
		t.Fatal(err)
	}
	m1.Close()

	m2 := newManager(t, cfg)
	killAllOnCleanup(t, m2)
	fa, err := m2.Agent(forks[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	if got := pyEval(t, fa, "x += 1\nx"); got != "42" {
		t.Errorf("x in fork after restart: %q", got)
	}
	c := create(t, m2, sandbox.CreateOptions{Snapshot: "kernel"})
	if got := pyEval(t, c.Agent, "x"); got != "41" {
		t.Errorf("x in sandbox from snapshot: %q", got)
	}
	// And in the source, through a pause and resume after the restart.
	if _, err := m2.Pause(ctx, src.SB.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := m2.Resume(ctx, src.SB.ID); err != nil {
		t.Fatal(err)
	}
	sa, err := m2.Agent(src.SB.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got := pyEval(t, sa, "x"); got != "41" {
		t.Errorf("x in source after fork's change, pause and resume: %q", got)
	}
}

// A snapshot that runs out of disk is refused as resource_exhausted,
// leaves no files or record, and the source runs on.
func TestSnapshotDiskFull(t *testing.T) {
	requireRunsc(t)
	cfg := testConfig(t)
	m, im := newImages(t, cfg)
	ctx := context.Background()
	src := create(t, m, sandbox.CreateOptions{Runtime: "runsc"})
	dir := snapshotDir(cfg)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	_, err := im.Snapshot(ctx, src.SB.ID, "full")
	if !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("snapshot with a full disk: %v, want resource exhausted", err)
	}
	t.Logf("snapshot with a full disk: %v", err)
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("failed snapshot left files: %v", ents)
	}
	if snaps, _ := im.Snapshots(ctx, ""); len(snaps) != 0 {
		t.Errorf("failed snapshot left records: %+v", snaps)
	}
	if r := src.Sh("echo alive"); r.Stdout != "alive\n" {
		t.Errorf("source after failed snapshot: %q", r.Stdout)
	}
}

// Snapshots and paused sandboxes outlive an upgrade of kiln: a Manager with
// another agent build (other bytes, so another agent dir) restores both.
func TestRestoreAfterAgentUpgrade(t *testing.T) {
	requireRunsc(t)
	cfg := testConfig(t)
	cfg.Adopt = true
	m1, im1 := newImages(t, cfg)
	ctx := context.Background()
	src := create(t, m1, sandbox.CreateOptions{Runtime: "runsc"})
	src.Sh("echo kept > /home/user/f")
	if _, err := im1.Snapshot(ctx, src.SB.ID, "s"); err != nil {
		t.Fatal(err)
	}
	if _, err := m1.Pause(ctx, src.SB.ID); err != nil {
		t.Fatal(err)
	}
	m1.Close()

	b, err := os.ReadFile(cfg.AgentPath)
	if err != nil {
		t.Fatal(err)
	}
	upgraded := filepath.Join(t.TempDir(), "kiln-agent")
	if err := os.WriteFile(upgraded, append(b, make([]byte, 4096)...), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg.AgentPath = upgraded
	m2 := newManager(t, cfg)
	killAllOnCleanup(t, m2)
	sb, err := m2.Create(ctx, sandbox.CreateOptions{Snapshot: "s"})
	if err != nil {
		t.Fatalf("create from a snapshot of the old build: %v", err)
	}
	if _, err := m2.Resume(ctx, src.SB.ID); err != nil {
		t.Fatalf("resume of a sandbox paused by the old build: %v", err)
	}
	for _, s := range []sandbox.Sandbox{sb, src.SB} {
		a, err := m2.Agent(s.ID)
		if err != nil {
			t.Fatal(err)
		}
		if r := sandboxtest.Wrap(t, m2, s, a).Sh("cat /home/user/f"); r.Stdout != "kept\n" {
			t.Errorf("sandbox %s after the upgrade: %q", s.ID, r.Stdout)
		}
	}
}

// A snapshot made by a Kiln whose sandboxes had another capability set
// (before NET_RAW, MKNOD and SETFCAP were dropped; its images record no
// set) still restores: runsc restores a checkpoint only with the set it
// was made with, so an image's set goes with it.
func TestRestoreSnapshotOfOlderCapabilities(t *testing.T) {
	requireRunsc(t)
	cfg := testConfig(t)
	m, im := newImages(t, cfg)
	killAllOnCleanup(t, m)
	ctx := context.Background()
	m.UseCapabilities(oci.LegacyCapabilities)
	src := create(t, m, sandbox.CreateOptions{Runtime: "runsc"})
	src.Sh("echo old > /home/user/f")
	if _, err := im.Snapshot(ctx, src.SB.ID, "old"); err != nil {
		t.Fatal(err)
	}
	recorded, _ := filepath.Glob(filepath.Join(cfg.StateDir, ".snapshots", "*", "caps.json"))
	if len(recorded) != 1 {
		t.Fatalf("snapshot records its capabilities in %v", recorded)
	}
	if err := os.Remove(recorded[0]); err != nil { // as the older Kiln's image
		t.Fatal(err)
	}
	m.UseCapabilities(nil)
	sb, err := m.Create(ctx, sandbox.CreateOptions{Snapshot: "old"})
	if err != nil {
		t.Fatalf("create from a snapshot of the older capability set: %v", err)
	}
	a, err := m.Agent(sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if r := sandboxtest.Wrap(t, m, sb, a).Sh("cat /home/user/f"); r.Stdout != "old\n" {
		t.Errorf("restored sandbox: %q", r.Stdout)
	}
	// A fork of it (today's Kiln, the older set) restores with its set.
	if _, err := im.Fork(ctx, sb.ID, 1, sandbox.Quota{}); err != nil {
		t.Errorf("fork of a sandbox with the older set: %v", err)
	}
}
