package template_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/store/sqlite"
	"github.com/kiln-sh/kiln/internal/template"
)

// writeBuild lays out a custom template's build as the engine publishes
// it: its manifest names its layers.
func writeBuild(t *testing.T, dataDir, id string, layers ...string) {
	t.Helper()
	dir := template.BuildDir(dataDir, id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(template.Template{Name: id, Hash: id, Build: id, Layers: layers})
	if err := os.WriteFile(filepath.Join(dir, "template.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// A name means, to a caller: its own template of that name and tag, else
// a public one, else the built-in; another key's private template is
// invisible, and a build stays reachable by id whatever its name points
// at now.
func TestCatalogResolve(t *testing.T) {
	ctx := context.Background()
	dataDir := t.TempDir()
	db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "kiln.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	// A built-in "base", laid out as template.Build does.
	base := filepath.Join(template.Dir(dataDir), "base", "h1")
	if err := os.MkdirAll(filepath.Join(base, "rootfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(template.Template{Name: "base", Hash: "h1"})
	if err := os.WriteFile(filepath.Join(base, "template.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("h1", filepath.Join(template.Dir(dataDir), "base", "current")); err != nil {
		t.Fatal(err)
	}
	writeBuild(t, dataDir, "bld00000001", "/l/a", "/l/b", "/l/c")
	writeBuild(t, dataDir, "bld00000002", "/l/a")
	writeBuild(t, dataDir, "bld00000003", "/l/x")
	now := time.Now()
	for _, tag := range []template.TagRecord{
		{Owner: "alice", Name: "web", Tag: "default", BuildID: "bld00000001", UpdatedAt: now},
		{Owner: "alice", Name: "web", Tag: "v2", BuildID: "bld00000002", UpdatedAt: now},
		{Owner: "alice", Name: "base", Tag: "default", BuildID: "bld00000002", UpdatedAt: now}, // shadows the built-in for alice
		{Owner: "bob", Name: "tools", Tag: "default", BuildID: "bld00000003", Public: true, UpdatedAt: now},
		{Owner: "bob", Name: "secret", Tag: "default", BuildID: "bld00000003", UpdatedAt: now},
	} {
		if err := db.PutTag(ctx, tag); err != nil {
			t.Fatal(err)
		}
	}
	c := &template.Catalog{DataDir: dataDir, Store: db}
	for _, tc := range []struct {
		owner, ref string
		build      string // "" for the built-in
		rootfs     string
		err        error
	}{
		{"alice", "web", "bld00000001", "/l/c:/l/b:/l/a", nil},
		{"alice", "web:default", "bld00000001", "/l/c:/l/b:/l/a", nil},
		{"alice", "web:v2", "bld00000002", "/l/a", nil},
		{"alice", "base", "bld00000002", "/l/a", nil},
		{"bob", "base", "", filepath.Join(base, "rootfs"), nil},
		{"alice", "tools", "bld00000003", "/l/x", nil}, // bob's, public
		{"alice", "secret", "", "", errdefs.ErrNotFound},
		{"bob", "web", "", "", errdefs.ErrNotFound},
		{"alice", "web:v3", "", "", errdefs.ErrNotFound},
		{"alice", "base:v2", "", "", errdefs.ErrNotFound},
		{"alice", "Web", "", "", errdefs.ErrInvalidArgument},
		{"alice", "../web", "", "", errdefs.ErrInvalidArgument},
		{"alice", "web:", "bld00000001", "/l/c:/l/b:/l/a", nil},
		{"alice", "web:a:b", "", "", errdefs.ErrInvalidArgument},
	} {
		got, err := c.Resolve(ctx, tc.owner, tc.ref)
		if tc.err != nil {
			if !errors.Is(err, tc.err) {
				t.Errorf("%s resolves %q: %v; want %v", tc.owner, tc.ref, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s resolves %q: %v", tc.owner, tc.ref, err)
			continue
		}
		if got.Build != tc.build || got.Rootfs != tc.rootfs {
			t.Errorf("%s resolves %q: build %q rootfs %q; want %q %q", tc.owner, tc.ref, got.Build, got.Rootfs, tc.build, tc.rootfs)
		}
	}
	// Where a template's files live, for a cluster front: the build and
	// the node it recorded, and its image in the cluster registry; zero
	// for a built-in or a name that means nothing.
	if err := db.PutBuild(ctx, template.BuildRecord{ID: "bld00000001", Template: "web", Owner: "alice",
		Status: template.BuildReady, Node: "node-7", Image: "reg.internal/kiln/alice/web:bld00000001@sha256:00", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		owner, ref string
		want       template.Where
	}{
		{"alice", "web", template.Where{Build: "bld00000001", Node: "node-7", Image: "reg.internal/kiln/alice/web:bld00000001@sha256:00"}},
		{"bob", "base", template.Where{}}, {"bob", "nothing", template.Where{}},
	} {
		if got, err := c.Where(ctx, tc.owner, tc.ref); err != nil || got != tc.want {
			t.Errorf("%s's %q is at %+v (%v), want %+v", tc.owner, tc.ref, got, err, tc.want)
		}
	}
	if _, err := c.Where(ctx, "alice", "../x"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Where of a bad ref: %v, want invalid argument", err)
	}
	// A tag moving to a new build leaves the old build reachable by id.
	if err := db.PutTag(ctx, template.TagRecord{Owner: "alice", Name: "web", Tag: "default", BuildID: "bld00000002", UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Build("bld00000001"); err != nil || got.Rootfs != "/l/c:/l/b:/l/a" {
		t.Errorf("old build by id: %+v, %v", got, err)
	}
	for id, want := range map[string]error{"bld99999999": errdefs.ErrNotFound, "../x": errdefs.ErrInvalidArgument, "": errdefs.ErrInvalidArgument} {
		if _, err := c.Build(id); !errors.Is(err, want) {
			t.Errorf("Build(%q): %v; want %v", id, err, want)
		}
	}

	// A ready build with an image whose files are not here is fetched
	// (once per Load; the fetcher keeps it); one without an image, or
	// not ready, is not found.
	if _, err := c.Load(ctx, "bld00000009"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Load of an unknown build without a fetcher: %v, want not found", err)
	}
	var fetched []string
	c.SetFetch(func(_ context.Context, rec template.BuildRecord) (*template.Template, error) {
		fetched = append(fetched, rec.ID)
		return &template.Template{Name: rec.Template, Build: rec.ID}, nil
	})
	for _, b := range []template.BuildRecord{
		{ID: "bld00000010", Template: "app", Owner: "alice", Status: template.BuildReady, Image: "reg.internal/kiln/a/app:x@sha256:01", CreatedAt: now},
		{ID: "bld00000011", Template: "app", Owner: "alice", Status: template.BuildReady, CreatedAt: now},
		{ID: "bld00000012", Template: "app", Owner: "alice", Status: template.BuildError, Image: "reg.internal/kiln/a/app:y@sha256:02", CreatedAt: now},
	} {
		if err := db.PutBuild(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := c.Load(ctx, "bld00000010"); err != nil || got.Build != "bld00000010" {
		t.Errorf("Load of a build in the registry: %+v, %v", got, err)
	}
	for _, id := range []string{"bld00000011", "bld00000012", "bld00000099"} {
		if _, err := c.Load(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("Load(%s): %v; want not found", id, err)
		}
	}
	if got, err := c.Load(ctx, "bld00000001"); err != nil || got.Rootfs != "/l/c:/l/b:/l/a" {
		t.Errorf("Load of a build held here: %+v, %v", got, err)
	}
	if !slices.Equal(fetched, []string{"bld00000010"}) {
		t.Errorf("fetched %v, want [bld00000010]", fetched)
	}
}
