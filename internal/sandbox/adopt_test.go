package sandbox_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/sandbox/sandboxtest"
)

// kiln serve, when it starts, removes the agent builds of earlier kilns
// that were last installed over a day ago, but not its own, not recent
// ones (another kiln may run them) and not one a sandbox it adopts runs.
func TestPruneAgents(t *testing.T) {
	cfg := testConfig(t)
	cfg.Adopt = true
	parent := filepath.Join(cfg.DataDir, "agent")
	build := func(name string, age time.Duration) string {
		dir := filepath.Join(parent, name)
		if err := os.MkdirAll(filepath.Join(dir, "pids"), 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		then := time.Now().Add(-age)
		if err := os.Chtimes(dir, then, then); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	m1 := newManager(t, cfg)
	suffix := sandbox.NewID().String() // unique among concurrent tests
	old := build("test-old-"+suffix, 48*time.Hour)
	recent := build("test-recent-"+suffix, time.Hour)
	used := build("test-used-"+suffix, 48*time.Hour)
	e := create(t, m1, sandbox.CreateOptions{})
	// The sandbox runs an older build: its bundle names that build's dir.
	bundle := filepath.Join(cfg.StateDir, e.SB.ID.String(), "config.json")
	b, err := os.ReadFile(bundle)
	if err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(parent)
	if err != nil {
		t.Fatal(err)
	}
	replaced := false
	for _, ent := range ents {
		dir := filepath.Join(parent, ent.Name())
		if bytes.Contains(b, []byte(dir+`"`)) {
			b, replaced = bytes.ReplaceAll(b, []byte(dir+`"`), []byte(used+`"`)), true
		}
	}
	if !replaced {
		t.Fatalf("bundle names no agent dir under %s", parent)
	}
	if err := os.WriteFile(bundle, b, 0o600); err != nil {
		t.Fatal(err)
	}
	m1.Close()

	m2 := newManager(t, cfg)
	killAllOnCleanup(t, m2)
	if _, err := os.Stat(old); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("old build kept: %v", err)
	}
	for _, dir := range []string{recent, used} {
		if _, err := os.Stat(dir); err != nil {
			t.Errorf("build %s removed: %v", filepath.Base(dir), err)
		}
	}
	a, err := m2.Agent(e.SB.ID)
	if err != nil {
		t.Fatal(err)
	}
	if r := sandboxtest.Wrap(t, m2, e.SB, a).Sh("echo ok"); r.Stdout != "ok\n" {
		t.Errorf("adopted sandbox: %q", r.Stdout)
	}
}
