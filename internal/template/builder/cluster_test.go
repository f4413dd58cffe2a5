package builder_test

import (
	"context"
	"errors"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/registry"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/oci/ocitest"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/servetest"
	"github.com/kiln-sh/kiln/internal/template"
	"github.com/kiln-sh/kiln/internal/template/builder"
	"github.com/kiln-sh/kiln/internal/template/layer"
)

// otherNode is a second node of env e's cluster: its own data dir and
// layer store (its built-in templates e's, unless bare), e's records.
func otherNode(t *testing.T, e *env, reg string, bare bool) (*builder.Builder, *template.Catalog) {
	t.Helper()
	dir := t.TempDir()
	if !bare {
		dir = otherDataDir(t, e)
	}
	return otherNodeAt(t, e, dir, reg, nil)
}

// otherDataDir is a data dir with e's built-in templates.
func otherDataDir(t *testing.T, e *env) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Symlink(template.Dir(e.dataDir), template.Dir(dir)); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestClusterFetch: a build of a node with a cluster registry is pushed
// there (its own layers only, on a built-in) before it is ready; another
// node resolving the template pulls it once however many ask at once,
// with the same config and content, keeps it across a restart, and
// refuses clearly when it lacks the built-in build underneath, or
// answers unavailable when the registry is gone. A push that fails fails
// the build.
func TestClusterFetch(t *testing.T) {
	ocitest.RequireRoot(t)
	var manifests atomic.Int64
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/manifests/") {
			manifests.Add(1)
		}
		reg.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	prefix := strings.TrimPrefix(srv.URL, "http://") + "/kiln"
	e := newEnvWith(t, "runc", func(_ *sandbox.Config, c *builder.Config) { c.ClusterRegistry = prefix })

	rec, logs := e.build("Key_A", "app", api.TemplateSpec{From: api.TemplateBase{Template: "base"}, Steps: []api.TemplateStep{
		{Type: api.StepRun, Args: []string{"echo fetched-42 >/opt/marker", "root"}},
		{Type: api.StepEnv, Args: []string{"STAGE", "two"}},
		{Type: api.StepWorkdir, Args: []string{"/srv"}},
	}, StartCmd: "sleep 1000", ReadyCmd: "true"})
	if rec.Status != template.BuildReady {
		t.Fatalf("build: %s %q%s", rec.Status, rec.Reason, lines(logs))
	}
	if want := prefix + "/key-a/app:" + rec.ID + "@sha256:"; !strings.HasPrefix(rec.Image, want) {
		t.Errorf("the build's image: %q, want %s…", rec.Image, want)
	}
	if !strings.Contains(lines(logs), "pushed sha256:") {
		t.Errorf("the build's log says nothing of the push:%s", lines(logs))
	}
	here, err := e.catalog.Resolve(t.Context(), "Key_A", "app")
	if err != nil {
		t.Fatal(err)
	}

	b2, cat2 := otherNode(t, e, prefix, false)
	var wg sync.WaitGroup
	got := make([]*template.Template, 8)
	errs := make([]error, 8)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], errs[i] = cat2.Resolve(t.Context(), "Key_A", "app")
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("resolving the template on the other node: %v", err)
	}
	if n := manifests.Load(); n != 1 {
		t.Errorf("8 concurrent resolves pulled the image %d times, want once", n)
	}
	for _, g := range got[1:] {
		if g.Dir != got[0].Dir || g.Rootfs != got[0].Rootfs {
			t.Errorf("concurrent resolves disagree: %+v vs %+v", g, got[0])
		}
	}
	there := got[0]
	if diff := cmp.Diff(here, there, cmp.FilterPath(func(p cmp.Path) bool {
		s := p.String()
		return s == "Dir" || s == "Rootfs" || s == "Layers"
	}, cmp.Ignore())); diff != "" {
		t.Errorf("the pulled build's manifest (-built +pulled):\n%s", diff)
	}
	if there.Defaults.Env["STAGE"] != "two" || there.Defaults.Workdir != "/srv" || there.Defaults.User != "user" ||
		there.Warm == nil || there.Warm.Start != "sleep 1000" || there.Warm.Ready != "true" {
		t.Errorf("the pulled build's defaults %+v, warm %+v", there.Defaults, there.Warm)
	}
	if len(there.Layers) != len(here.Layers) || there.Layers[0] != here.Layers[0] || there.Layers[len(there.Layers)-1] == here.Layers[len(here.Layers)-1] {
		t.Errorf("layers: built %v, pulled %v; want base's the same dirs and the build's own in the other node's store", here.Layers, there.Layers)
	}
	if b, err := os.ReadFile(there.File("/opt/marker")); err != nil || string(b) != "fetched-42\n" {
		t.Errorf("the marker in the pulled build: %q, %v", b, err)
	}

	// A restart keeps it: no pull.
	b2.Close()
	_, cat3 := otherNodeAt(t, e, cat2.DataDir, prefix, nil)
	if _, err := cat3.Resolve(t.Context(), "Key_A", "app"); err != nil || manifests.Load() != 1 {
		t.Errorf("after a restart: %v, %d pulls in all; want the build without a pull", err, manifests.Load())
	}

	// A node without base's build refuses, saying why.
	_, bare := otherNode(t, e, prefix, true)
	if _, err := bare.Resolve(t.Context(), "Key_A", "app"); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "does not hold") {
		t.Errorf("a node without base's build: %v; want failed_precondition, saying so", err)
	}

	// A node that cannot reach the registry answers unavailable (a
	// front tries another node), without the registry's address.
	srv.Close()
	_, cut := otherNode(t, e, prefix, false)
	if _, err := cut.Resolve(t.Context(), "Key_A", "app"); !errors.Is(err, errdefs.ErrUnavailable) || strings.Contains(err.Error(), "127.0.0.1") {
		t.Errorf("a node without the registry: %v; want unavailable, not naming the registry", err)
	}

	// A registry that does not answer fails the build, saying so.
	dead := servetest.FreeAddr(t) + "/kiln"
	e2 := newEnvWith(t, "runc", func(_ *sandbox.Config, c *builder.Config) { c.ClusterRegistry = dead })
	rec, logs = e2.build("key_b", "env-only", api.TemplateSpec{From: api.TemplateBase{Template: "base"},
		Steps: []api.TemplateStep{{Type: api.StepEnv, Args: []string{"A", "1"}}}})
	if rec.Status != template.BuildError || !strings.Contains(rec.Reason, "cluster registry") || rec.Image != "" {
		t.Errorf("a build whose push fails: %s %q %q; want error, naming the cluster registry%s", rec.Status, rec.Reason, rec.Image, lines(logs))
	}
}

// otherNodeAt is otherNode on an existing data dir (a restart), taking
// warm snapshots with im (nil: none).
func otherNodeAt(t *testing.T, e *env, dir, reg string, im *sandbox.Images) (*builder.Builder, *template.Catalog) {
	t.Helper()
	layers, err := layer.Open(filepath.Join(dir, "layers"))
	if err != nil {
		t.Fatal(err)
	}
	cat := &template.Catalog{DataDir: dir, Store: e.records}
	b, err := builder.New(context.Background(), builder.Config{DataDir: dir, Node: "node-2", Records: e.records, Layers: layers,
		Catalog: cat, ClusterRegistry: reg, BuildTimeout: time.Minute, Images: im,
		Log: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	cat.SetFetch(b.Fetch)
	return b, cat
}

// TestClusterFetchWarm: a node that pulls a template with a start
// command takes its warm snapshot in the background (runsc), as kiln
// serve does for the built-ins; the pull itself does not wait for it.
func TestClusterFetchWarm(t *testing.T) {
	ocitest.RequireRoot(t)
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(reg)
	t.Cleanup(srv.Close)
	prefix := strings.TrimPrefix(srv.URL, "http://") + "/kiln"
	e := newEnvWith(t, "runsc", func(_ *sandbox.Config, c *builder.Config) { c.ClusterRegistry = prefix })
	if !e.im.CanWarm() {
		ocitest.Require(t, false, "runsc cannot checkpoint here")
	}
	rec, logs := e.build("key_w", "served", api.TemplateSpec{From: api.TemplateBase{Template: "base"},
		StartCmd: "sleep 1000", ReadyCmd: "true"})
	if rec.Status != template.BuildReady || rec.Image == "" {
		t.Fatalf("build: %s %q %q%s", rec.Status, rec.Reason, rec.Image, lines(logs))
	}
	_, cat := otherNodeAt(t, e, otherDataDir(t, e), prefix, e.im)
	t0 := time.Now()
	there, err := cat.Resolve(t.Context(), "key_w", "served")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pulled in %v", time.Since(t0))
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		if m, _ := filepath.Glob(filepath.Join(there.Dir, "warm", "*", "warm.json")); len(m) > 0 {
			t.Logf("warm snapshot taken %v after the pull", time.Since(t0))
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no warm snapshot of the pulled template after 2 minutes")
		}
	}
}
