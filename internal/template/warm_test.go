package template

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestWarmKey(t *testing.T) {
	a, b := CodeInterpreter(), CodeInterpreter()
	b.Warm = &Warm{Language: "python", Code: "import json"}
	if a.Warm.Key("runsc 1", "agent a") == b.Warm.Key("runsc 1", "agent a") {
		t.Error("changing the warm step kept its key")
	}
	for _, env := range [][]string{{"runsc 2", "agent a"}, {"runsc 1", "agent b"}} {
		if a.Warm.Key("runsc 1", "agent a") == a.Warm.Key(env...) {
			t.Errorf("key ignores %v", env)
		}
	}
}

// A published build learns a new warm step without being rebuilt.
func TestPublishedBuildRecordsWarm(t *testing.T) {
	dataDir := t.TempDir()
	r := CodeInterpreter()
	tmpl := fakeBuild(t, dataDir, r) // manifest without a warm step
	tmpl.Warm = r.Warm
	if existed, err := PublishBuiltin(dataDir, tmpl); err != nil || !existed {
		t.Fatalf("publishing with a warm step: existed=%v, %v", existed, err)
	}
	got, err := Lookup(dataDir, r.Name)
	if err != nil {
		t.Fatal(err)
	}
	if got.Warm == nil || *got.Warm != *r.Warm || got.Hash != tmpl.Hash {
		t.Fatalf("manifest after publishing: warm %+v hash %s, want %+v %s", got.Warm, got.Hash, r.Warm, tmpl.Hash)
	}
}

func TestPublishCheckpoint(t *testing.T) {
	dataDir := t.TempDir()
	r := CodeInterpreter()
	fakeBuild(t, dataDir, r)
	tmpl, err := Lookup(dataDir, r.Name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tmpl.Checkpoint("nope"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing checkpoint: %v", err)
	}
	publish := func(key string) *Checkpoint {
		t.Helper()
		work, err := tmpl.NewCheckpointDir()
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(work, "disk.img"), []byte(key), 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := tmpl.PublishCheckpoint(work, &Checkpoint{Key: key, CreatedAt: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	keys := []string{"k1", "k2", "k3", "k4"}
	for i, k := range keys {
		c := publish(k)
		if b, err := os.ReadFile(c.Disk()); err != nil || string(b) != k {
			t.Fatalf("published disk: %q %v", b, err)
		}
		// Distinct mtimes, oldest first.
		old := time.Now().Add(time.Duration(i-10) * time.Minute)
		_ = os.Chtimes(c.Dir, old, old)
	}
	for i, k := range keys {
		_, err := tmpl.Checkpoint(k)
		if kept := i >= len(keys)-keepCheckpoints; kept != (err == nil) {
			t.Errorf("checkpoint %s: kept=%v, err=%v", k, kept, err)
		}
	}
	// Publishing a key that exists keeps the existing one.
	if c := publish("k4"); c.Dir != filepath.Join(tmpl.Dir, "warm", "k4") {
		t.Errorf("republished at %s", c.Dir)
	}
}

// One warm build at a time per template build, across processes (flock:
// here two opens in one process, which conflict the same way).
func TestLockWarm(t *testing.T) {
	dataDir := t.TempDir()
	r := CodeInterpreter()
	fakeBuild(t, dataDir, r)
	tmpl, err := Lookup(dataDir, r.Name)
	if err != nil {
		t.Fatal(err)
	}
	unlock, err := tmpl.LockWarm(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := tmpl.LockWarm(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second lock while held: %v, want to wait until the deadline", err)
	}
	unlock()
	unlock2, err := tmpl.LockWarm(context.Background())
	if err != nil {
		t.Fatalf("lock after unlock: %v", err)
	}
	unlock2()
}
