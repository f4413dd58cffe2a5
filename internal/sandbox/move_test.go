package sandbox_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/sandbox/sandboxtest"
)

// A runsc sandbox paused with a shared snapshot dir survives a restart of
// its node (its image is not in its dir), and resumes on another node
// (another Manager, state dir and name, one store and shared dir) once
// its record names that node: with its files, and its processes as they
// were. The first node, which still holds its paused copy, refuses to
// resume it, and drops it (Disown) without touching the record.
func TestPausedMovesThroughSharedDir(t *testing.T) {
	shared := t.TempDir()
	cfg1 := testConfig(t)
	cfg1.Adopt, cfg1.Node, cfg1.Cluster.SnapshotDir = true, "node-1", shared
	m1 := newManager(t, cfg1)
	e := create(t, m1, sandbox.CreateOptions{Runtime: "runsc"})
	e.Sh("echo kept > /home/user/state.txt")
	pid := startCounter(t, e)
	ctx := context.Background()
	p, err := m1.Pause(ctx, e.SB.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(p.Image, "paused/"+e.SB.ID.String()+".") {
		t.Fatalf("paused record's image = %q, want one in the shared dir", p.Image)
	}
	dir1 := filepath.Join(cfg1.StateDir, e.SB.ID.String())
	if _, err := os.Stat(filepath.Join(dir1, "checkpoint")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a checkpoint in the node's own dir too: %v", err)
	}

	m1.Close()
	m1 = newManager(t, cfg1) // a restart: it adopts the paused sandbox, whose container it does not know
	if sb, err := m1.Get(ctx, e.SB.ID); err != nil || sb.State != sandbox.StatePaused || sb.Image != p.Image {
		t.Fatalf("after node-1's restart: %+v, %v; want paused with its shared image", sb, err)
	}

	// What a front's move does (cluster.Store.MoveSandbox), then node-2.
	cfg2 := cfg1
	cfg2.StateDir, cfg2.Node = filepath.Join(t.TempDir(), "sandboxes"), "node-2"
	moved := p
	moved.Node = "node-2"
	if err := cfg1.Store.PutSandbox(ctx, moved); err != nil {
		t.Fatal(err)
	}
	m2 := newManager(t, cfg2)
	t.Cleanup(func() { _ = m2.Kill(context.Background(), e.SB.ID) })
	sb, err := m2.Resume(ctx, e.SB.ID)
	if err != nil {
		t.Fatalf("resume on node-2: %v", err)
	}
	if sb.State != sandbox.StateRunning || sb.Node != "node-2" || sb.Image != "" {
		t.Errorf("after the resume on node-2: %+v", sb)
	}
	a, err := m2.Agent(e.SB.ID)
	if err != nil {
		t.Fatal(err)
	}
	e2 := sandboxtest.Wrap(t, m2, e.SB, a)
	if r := e2.Sh("cat /home/user/state.txt"); r.Stdout != "kept\n" {
		t.Errorf("file after the move: %q", r.Stdout)
	}
	attachCounter(t, a, pid)
	if ents, _ := os.ReadDir(filepath.Join(shared, "paused")); len(ents) != 0 {
		t.Logf("shared images left right after the resume (removed in the background): %d", len(ents))
	}

	// node-1 still holds its paused copy (it was cut off, say): it must
	// not resume it now that node-2 runs it.
	if _, err := m1.Resume(ctx, e.SB.ID); !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "moved to node node-2") {
		t.Errorf("resume on node-1 after the move: %v, want not_found: moved", err)
	}
	if err := m1.Disown(ctx, e.SB.ID); err != nil {
		t.Fatalf("Disown on node-1: %v", err)
	}
	if _, err := os.Stat(dir1); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("node-1 kept the sandbox's dir: %v", err)
	}
	if rec, err := cfg1.Store.GetSandbox(ctx, e.SB.ID); err != nil || rec.Node != "node-2" || rec.State != sandbox.StateRunning {
		t.Errorf("record after node-1 dropped its copy: %+v, %v; want running on node-2", rec, err)
	}
}
