package template

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

func TestRecipeHash(t *testing.T) {
	a, b := Base(), Base()
	if a.Hash() != b.Hash() {
		t.Fatal("the same recipe hashes differently")
	}
	b.Include = append(b.Include, "curl")
	if a.Hash() == b.Hash() {
		t.Fatal("a changed recipe kept its hash: the template would not be rebuilt")
	}
	c := Base()
	c.Defaults.Env["X"] = "y"
	if a.Hash() == c.Hash() {
		t.Fatal("changed defaults kept the hash")
	}
}

func TestValidName(t *testing.T) {
	for name, want := range map[string]bool{
		"base": true, "code-interpreter": true, "py3.11_x": true,
		"": false, "../etc": false, "Base": false, "a/b": false, "-x": false,
	} {
		if got := ValidName(name); got != want {
			t.Errorf("ValidName(%q) = %v, want %v", name, got, want)
		}
	}
}

// fakeBuild lays out a finished build of r under dataDir as Build would.
func fakeBuild(t *testing.T, dataDir string, r *Recipe) {
	t.Helper()
	dir := filepath.Join(Dir(dataDir), r.Name, r.Hash())
	if err := os.MkdirAll(filepath.Join(dir, "rootfs", "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(Template{Name: r.Name, Hash: r.Hash(), Defaults: r.Defaults})
	if err := os.WriteFile(filepath.Join(dir, manifestName), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestCachedBuildIsReused(t *testing.T) {
	dataDir := t.TempDir()
	r := Base()
	fakeBuild(t, dataDir, r)
	// A cached build must not run debootstrap: with an unreachable mirror
	// and no root, a real build would fail.
	tmpl, err := Build(context.Background(), dataDir, r, BuildOptions{Mirror: "http://127.0.0.1:1/none"})
	if err != nil {
		t.Fatalf("Build of a cached recipe: %v", err)
	}
	if tmpl.Hash != r.Hash() {
		t.Errorf("hash %s, want %s", tmpl.Hash, r.Hash())
	}
	got, err := Lookup(dataDir, "base")
	if err != nil || got.Rootfs != filepath.Join(Dir(dataDir), "base", r.Hash(), "rootfs") || got.Defaults.User != "user" {
		t.Fatalf("Lookup after Build: %+v, %v", got, err)
	}
	ts, err := List(dataDir)
	if err != nil || len(ts) != 1 || ts[0].Name != "base" {
		t.Errorf("List = %+v, %v", ts, err)
	}
}

func TestLookupErrors(t *testing.T) {
	dataDir := t.TempDir()
	if _, err := Lookup(dataDir, "base"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unbuilt template: %v, want not found", err)
	}
	if _, err := Lookup(dataDir, "../x"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("bad name: %v, want invalid argument", err)
	}
}
