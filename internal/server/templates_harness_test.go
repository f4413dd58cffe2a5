package server_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/client"
	"github.com/kiln-sh/kiln/internal/metrics"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/store/sqlite"
	"github.com/kiln-sh/kiln/internal/template"
	"github.com/kiln-sh/kiln/internal/template/builder"
	"github.com/kiln-sh/kiln/internal/template/layer"
)

// templateRuntime is the runtime of the template tests' build sandboxes
// (runsc, Kiln's default, unless KILN_TEST_RUNTIME says otherwise).
func templateRuntime() string {
	if rt := os.Getenv("KILN_TEST_RUNTIME"); rt != "" {
		return rt
	}
	return "runsc"
}

// templateCatalog is a catalog in a data dir of the test's own whose
// templates/ is the machine's (the built-ins), as kiln serve's.
func templateCatalog(t testing.TB, realDataDir string, st *sqlite.Store) *template.Catalog {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "data")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(template.Dir(realDataDir), template.Dir(dir)); err != nil {
		t.Fatal(err)
	}
	return &template.Catalog{DataDir: dir, Store: st}
}

// newBuilder starts a builder as kiln serve does, without networking.
func newBuilder(t testing.TB, o harnessOpts, catalog *template.Catalog, st *sqlite.Store, m *sandbox.Manager,
	im *sandbox.Images, mt *metrics.Metrics, log *slog.Logger) *builder.Builder {
	t.Helper()
	layers, err := layer.Open(filepath.Join(catalog.DataDir, "layers"))
	if err != nil {
		t.Fatal(err)
	}
	b := o.builds.WithDefaults()
	bld, err := builder.New(context.Background(), builder.Config{
		DataDir: catalog.DataDir, Records: st, Layers: layers, Catalog: catalog, Sandboxes: m, Images: im,
		Runtime: o.templates, Network: sandbox.NetworkNone, BuildTimeout: 10 * time.Minute,
		MaxLayerBytes: b.MaxLayerBytes, MaxContextBytes: b.MaxContextBytes,
		MaxPerOwner: b.MaxPerKey, MaxConcurrent: b.MaxConcurrent, Observer: mt, Log: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	return bld
}

// templateHarness is a server with templates on rt, and a client per key.
func templateHarness(t *testing.T, rt string, o harnessOpts) (*harness, *client.Client, *client.Client, *client.Client) {
	t.Helper()
	o.templates = rt
	h := newHarness(t, true, o)
	return h, client.New(h.ts.URL, h.a), client.New(h.ts.URL, h.b), client.New(h.ts.URL, h.admin)
}

// testCtx bounds a template test: builds are slow on a loaded machine.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// build starts a build and waits for it to end, failing the test unless
// it ends with status want.
func build(t *testing.T, ctx context.Context, c *client.Client, ref string, spec api.TemplateSpec, want string) *api.TemplateBuild {
	t.Helper()
	b, err := c.StartTemplateBuild(ctx, api.TemplateBuildRequest{Template: ref, Spec: spec})
	if err != nil {
		t.Fatalf("starting a build of %s: %v", ref, err)
	}
	got, err := c.WaitTemplateBuild(ctx, b.ID)
	if err != nil {
		t.Fatalf("waiting for build %s: %v", b.ID, err)
	}
	if got.Status != want {
		t.Fatalf("build %s of %s: status %s (%s), want %s", got.ID, ref, got.Status, got.Reason, want)
	}
	return got
}

// logOf is a build's whole log.
func logOf(t *testing.T, ctx context.Context, c *client.Client, id string) []api.TemplateLogEntry {
	t.Helper()
	var es []api.TemplateLogEntry
	if err := c.TemplateBuildLogs(ctx, id, 0, false, func(e api.TemplateLogEntry) error { es = append(es, e); return nil }); err != nil {
		t.Fatalf("reading the log of %s: %v", id, err)
	}
	return es
}

// sh runs script in sandbox id and returns its stdout, failing the test
// unless it exits 0.
func sh(t *testing.T, ctx context.Context, c *client.Client, id, script string) string {
	t.Helper()
	res, err := c.Output(ctx, id, api.CommandRequest{Cmd: script})
	if err != nil {
		t.Fatalf("running %q: %v", script, err)
	}
	if res.Exit.Code != 0 {
		t.Fatalf("%q exited %d: %s%s", script, res.Exit.Code, res.Stdout, res.Stderr)
	}
	return res.Stdout
}

// metricsText is /metrics as the admin key sees it.
func metricsText(t *testing.T, h *harness) string {
	t.Helper()
	resp := h.request("GET", "/metrics", h.admin, nil)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
