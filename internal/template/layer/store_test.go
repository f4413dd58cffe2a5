package layer

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/errdefs"
)

func TestKey(t *testing.T) {
	base := api.TemplateStep{Type: "COPY", Args: []string{"a b", "/x"}, FilesHash: "ff"}
	k := Key("p", base)
	// Stability: the key of a step is part of the on-disk cache; it must
	// not change between releases unless keyVersion does. (The value is the
	// documented encoding, computed independently.)
	if k != Key("p", base) || k != "939545b1db6a00d7503bf3e793e706de92545ae8f9b114c4bf354d4dda6f830f" {
		t.Fatalf("Key = %s: changed (bump keyVersion on purpose, then update this test)", k)
	}
	same := []api.TemplateStep{
		{Type: "COPY", Args: []string{"a b", "/x"}, FilesHash: "ff", Force: true},
		{Type: "COPY", Args: []string{"a b", "/x"}, FilesHash: "ff", Line: 12},
	}
	for _, s := range same {
		if Key("p", s) != k {
			t.Errorf("Key(%+v) differs: Force and Line are not part of the key", s)
		}
	}
	seen := map[string]string{k: "base"}
	for name, key := range map[string]string{
		"parent":          Key("q", base),
		"no parent":       Key("", base),
		"type":            Key("p", api.TemplateStep{Type: "ADD", Args: base.Args, FilesHash: "ff"}),
		"args split":      Key("p", api.TemplateStep{Type: "COPY", Args: []string{"a", "b", "/x"}, FilesHash: "ff"}),
		"arg":             Key("p", api.TemplateStep{Type: "COPY", Args: []string{"a b", "/y"}, FilesHash: "ff"}),
		"files hash":      Key("p", api.TemplateStep{Type: "COPY", Args: base.Args, FilesHash: "fe"}),
		"hash into args":  Key("p", api.TemplateStep{Type: "COPY", Args: []string{"a b", "/x", "ff"}}),
		"extra":           Key("p", base, "USER=root"),
		"extra split":     Key("p", base, "USER=", "root"),
		"parent into arg": Key("", api.TemplateStep{Type: "COPY", Args: []string{"p", "a b", "/x"}, FilesHash: "ff"}),
	} {
		if other, dup := seen[key]; dup {
			t.Errorf("%s: same key as %s", name, other)
		}
		seen[key] = name
	}
}

const testKey = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"

func keyN(i int) string { return fmt.Sprintf("%064x", i+1) }

// publish makes a layer holding one file and publishes it under key.
func publish(t *testing.T, s *Store, key, content string) *Layer {
	t.Helper()
	p, err := s.Create()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p.Dir(), "f"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := p.Publish(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func entries(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func TestPublishRace(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	const n = 16
	layers := make([]*Layer, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := s.Create()
			if err != nil {
				t.Error(err)
				return
			}
			os.WriteFile(filepath.Join(p.Dir(), "f"), []byte(fmt.Sprint(i)), 0o644)
			<-start
			if layers[i], err = p.Publish(context.Background(), testKey); err != nil {
				t.Error(err)
			}
		}()
	}
	close(start)
	wg.Wait()
	if t.Failed() {
		return
	}
	want, err := os.ReadFile(filepath.Join(layers[0].Dir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range layers {
		got, err := os.ReadFile(filepath.Join(l.Dir(), "f"))
		if err != nil || string(got) != string(want) || l.Key() != testKey {
			t.Errorf("caller %d got layer %s with %q (%v), caller 0 %q", i, l.Key(), got, err, want)
		}
		l.Release()
	}
	if got := entries(t, s.path(layersDir)); len(got) != 1 {
		t.Errorf("layers: %v, want one", got)
	}
	if got := entries(t, s.path(tmpDir)); len(got) != 0 {
		t.Errorf("tmp left: %v", got)
	}
	info, err := s.Stat(testKey)
	if err != nil || info.Size <= 0 {
		t.Errorf("Stat = %+v, %v", info, err)
	}
}

func TestGC(t *testing.T) {
	ctx := context.Background()
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		publish(t, s, keyN(i), "x").Release()
	}
	lease, err := s.Acquire(keyN(1))
	if err != nil {
		t.Fatal(err)
	}
	pending, err := s.Create() // a publish in progress
	if err != nil {
		t.Fatal(err)
	}
	keep := func(k string) bool { return k == keyN(0) }
	res, err := s.GC(ctx, keep)
	if err != nil {
		t.Fatal(err)
	}
	if res.Removed != 1 || res.Leased != 1 || res.Freed <= 0 {
		t.Errorf("GC = %+v, want 1 removed (freeing its size), 1 leased", res)
	}
	for i, want := range []error{nil, nil, errdefs.ErrNotFound} {
		if _, err := s.Stat(keyN(i)); !errors.Is(err, want) && !(want == nil && err == nil) {
			t.Errorf("Stat(layer %d) = %v, want %v", i, err, want)
		}
	}
	if _, err := os.Stat(pending.Dir()); err != nil {
		t.Errorf("GC removed an in-progress publish: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(lease.Dir(), "f")); err != nil || string(b) != "x" {
		t.Errorf("leased layer: %q, %v", b, err)
	}
	lease.Release()
	if _, err := pending.Publish(ctx, keyN(5)); err != nil {
		t.Fatal(err)
	}
	res, err = s.GC(ctx, nil)
	if err != nil || res.Removed != 2 || res.Leased != 1 {
		t.Errorf("GC = %+v, %v: want layers 0 and 1 removed, the new one (leased by its publisher) kept", res, err)
	}
	if _, err := s.Acquire(keyN(1)); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Acquire of a collected layer = %v", err)
	}
	if got := entries(t, s.path(tmpDir)); len(got) != 0 {
		t.Errorf("tmp left: %v", got)
	}
	if _, err := s.Acquire("../x"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Acquire(../x) = %v", err)
	}
}

// TestCrash kills (SIGKILL) a process in the middle of a publish, holding
// a lease: while it lives, GC keeps both; after, Open and GC leave
// nothing of the publish, and the layer it leased is collectable.
func TestCrash(t *testing.T) {
	if dir := os.Getenv("LAYER_CRASH_DIR"); dir != "" {
		crashHelper(dir)
		return
	}
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	publish(t, s, keyN(0), "leased by the helper").Release()

	cmd := exec.Command(os.Args[0], "-test.run=^TestCrash$")
	cmd.Env = append(os.Environ(), "LAYER_CRASH_DIR="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	ready := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if sc.Text() == "ready" {
				ready <- nil
				return
			}
		}
		ready <- fmt.Errorf("helper ended without getting ready: %v", sc.Err())
	}()
	select {
	case err := <-ready:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("helper not ready within 60 s")
	}
	res, err := s.GC(context.Background(), nil)
	if err != nil || res.Removed != 0 || res.Leased != 1 {
		t.Fatalf("GC while the helper lives = %+v, %v: want its lease honoured", res, err)
	}
	if got := entries(t, s.path(tmpDir)); len(got) != 1 {
		t.Fatalf("tmp = %v, want the helper's publish in progress", got)
	}
	cmd.Process.Kill()
	cmd.Wait()

	if _, err := Open(dir); err != nil {
		t.Fatal(err)
	}
	if got := entries(t, s.path(tmpDir)); len(got) != 0 {
		t.Errorf("tmp after the crash and Open = %v, want empty", got)
	}
	res, err = s.GC(context.Background(), nil)
	if err != nil || res.Removed != 1 || res.Leased != 0 {
		t.Errorf("GC after the crash = %+v, %v: want the layer the dead helper leased removed", res, err)
	}
	if got := entries(t, s.path(layersDir)); len(got) != 0 {
		t.Errorf("layers = %v, want none", got)
	}
}

// crashHelper leases layer 0, starts a publish, says ready and waits to
// be killed.
func crashHelper(dir string) {
	s, err := Open(dir)
	if err != nil {
		panic(err)
	}
	if _, err := s.Acquire(keyN(0)); err != nil {
		panic(err)
	}
	p, err := s.Create()
	if err != nil {
		panic(err)
	}
	os.WriteFile(filepath.Join(p.Dir(), "half"), make([]byte, 1<<20), 0o644)
	fmt.Println("ready")
	select {}
}
