package template

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

func TestBuiltinHash(t *testing.T) {
	d := Defaults{User: "user", Workdir: "/home/user", Env: map[string]string{"LANG": "C.UTF-8"}}
	a := BuiltinHash([]string{"k1", "k2"}, d)
	if a != BuiltinHash([]string{"k1", "k2"}, d) || !hashRE.MatchString(a) {
		t.Fatalf("hash %q: not stable or malformed", a)
	}
	d2 := d
	d2.Env = map[string]string{"LANG": "C"}
	for name, h := range map[string]string{
		"a changed layer": BuiltinHash([]string{"k1", "k3"}, d),
		"another layer":   BuiltinHash([]string{"k1", "k2", "k3"}, d),
		"changed env":     BuiltinHash([]string{"k1", "k2"}, d2),
	} {
		if h == a {
			t.Errorf("%s kept the hash: sandboxes would get the old build", name)
		}
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

// fakeBuild publishes a build of r under dataDir as a local build would,
// its one layer a dir with bin/ in it.
func fakeBuild(t *testing.T, dataDir string, r *Recipe) *Template {
	t.Helper()
	l := filepath.Join(dataDir, "layer-"+r.Name)
	if err := os.MkdirAll(filepath.Join(l, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	d := Defaults{User: "user", Workdir: "/home/user"}
	tmpl := &Template{Name: r.Name, Hash: BuiltinHash([]string{"k-" + r.Name}, d), Layers: []string{l}, Defaults: d}
	if _, err := PublishBuiltin(dataDir, tmpl); err != nil {
		t.Fatal(err)
	}
	return tmpl
}

func TestPublishBuiltin(t *testing.T) {
	dataDir := t.TempDir()
	r := Base()
	want := fakeBuild(t, dataDir, r)
	got, err := Lookup(dataDir, "base")
	if err != nil || got.Rootfs != want.Layers[0] || got.Hash != want.Hash || got.Defaults.User != "user" || got.Build != "" {
		t.Fatalf("Lookup after PublishBuiltin: %+v, %v", got, err)
	}
	// The same build again: found, its manifest kept.
	if existed, err := PublishBuiltin(dataDir, want); err != nil || !existed {
		t.Fatalf("publishing the same build again: existed=%v, %v", existed, err)
	}
	// A new build becomes current; the old one stays for its sandboxes.
	next := *want
	next.Hash, next.Layers = BuiltinHash([]string{"k-new"}, want.Defaults), []string{t.TempDir(), want.Layers[0]}
	if existed, err := PublishBuiltin(dataDir, &next); err != nil || existed {
		t.Fatalf("publishing a new build: existed=%v, %v", existed, err)
	}
	if got, err := Lookup(dataDir, "base"); err != nil || got.Hash != next.Hash || got.Rootfs != Lower(next.Layers) {
		t.Fatalf("Lookup after a new build: %+v, %v", got, err)
	}
	if _, err := ReadBuild(filepath.Join(Dir(dataDir), "base", want.Hash)); err != nil {
		t.Errorf("the replaced build is gone: %v", err)
	}
	ts, err := List(dataDir)
	if err != nil || len(ts) != 1 || ts[0].Name != "base" {
		t.Errorf("List = %+v, %v", ts, err)
	}
	if _, err := PublishBuiltin(dataDir, &Template{Name: "base", Hash: "../x"}); err == nil {
		t.Error("a malformed hash was published")
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
