package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/apikey"
	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/e2b"
	"github.com/kiln-sh/kiln/internal/metrics"
	"github.com/kiln-sh/kiln/internal/oci"
	"github.com/kiln-sh/kiln/internal/oci/ocitest"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/sandbox/sandboxtest"
	"github.com/kiln-sh/kiln/internal/server"
	"github.com/kiln-sh/kiln/internal/store/sqlite"
	"github.com/kiln-sh/kiln/internal/template"
)

// agentPath is a kiln-agent built once for the package's tests.
var agentPath string

func TestMain(m *testing.M) { os.Exit(sandboxtest.Main(m, &agentPath)) }

// testRuntime is the runtime the tests' sandboxes use (runc is the
// quicker to create; the sandbox package runs both).
func testRuntime() string {
	if rt := os.Getenv("KILN_TEST_RUNTIME"); rt != "" {
		return rt
	}
	return "runc"
}

// harness is a real server over a real Manager, SQLite store and keys.
type harness struct {
	t       testing.TB
	m       *sandbox.Manager
	srv     *server.Server
	ts      *httptest.Server
	store   *sqlite.Store
	mt      *metrics.Metrics
	tdata   string // the data dir of builds (harnessOpts.templates)
	admin   string // secrets
	a, b    string
	sandbox bool // sandboxes can be created
}

type harnessOpts struct {
	quotaA   int
	ping     time.Duration
	keyCache time.Duration
	edge     config.Edge // the HTTP edge's limits (defaults if zero)
	e2b      bool        // also serve E2B's API
	// header sets the server's ReadHeaderTimeout (HTTPServer's if 0).
	header time.Duration
	// templates, if set, serves /v1/templates with a builder whose build
	// sandboxes use this runtime, in a data dir of the test's own (the
	// built-in templates shared); builds limits the builder.
	templates string
	builds    config.Builds
	// volumeQuota, if set, serves volumes (in the test's own dir) with
	// this quota per key.
	volumeQuota int64
}

// newHarness builds a server. With root and the base template it can
// create sandboxes (needSandboxes skips otherwise); without, it serves
// everything up to the domain calls.
func newHarness(t testing.TB, needSandboxes bool, o harnessOpts) *harness {
	t.Helper()
	cfg := config.FromEnv()
	cfg.AgentPath = agentPath
	cfg.Runtime = testRuntime()
	dir := t.TempDir()
	_, terr := template.Lookup(cfg.DataDir, "base")
	canSandbox := os.Geteuid() == 0 && terr == nil
	if needSandboxes {
		ocitest.RequireRoot(t)
		ocitest.Require(t, terr == nil, fmt.Sprintf("base template not built (make setup): %v", terr))
		_, err := exec.LookPath(cfg.Runtime)
		ocitest.Require(t, err == nil, cfg.Runtime+" not installed")
	}
	if !canSandbox {
		cfg.DataDir = filepath.Join(dir, "data")
	}
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "kiln.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	log := slog.New(slog.NewTextHandler(newTestWriter(t), nil))
	var catalog *template.Catalog
	if o.templates != "" {
		catalog = templateCatalog(t, cfg.DataDir, st)
	}
	vols := newVolumes(t, filepath.Join(dir, "volumes"), st, o.volumeQuota)
	sc := sandbox.Config{Config: cfg, StateDir: filepath.Join(dir, "sandboxes"), Store: st, Catalog: catalog}
	if vols != nil {
		sc.Volumes = vols
	}
	m, err := sandbox.NewManager(context.Background(), sc, runtimes(cfg), log)
	if err != nil {
		t.Fatal(err)
	}
	im, err := sandbox.NewImages(context.Background(), m)
	if err != nil {
		t.Fatal(err)
	}
	mt := metrics.New(m)
	mt.RegisterImages(im)
	h := &harness{t: t, m: m, store: st, mt: mt, sandbox: canSandbox}
	if catalog != nil {
		h.tdata = catalog.DataDir
	}
	h.admin = h.makeKey("admin", true, 0)
	h.a = h.makeKey("a", false, o.quotaA)
	h.b = h.makeKey("b", false, 0)
	cfg.Server.Edge = o.edge
	so := server.Options{
		Manager: m, Images: im, Keys: st, Log: log, Metrics: mt, Config: cfg, Version: "test",
		PingInterval: o.ping, KeyCacheTTL: o.keyCache, Volumes: vols, Nodes: st,
	}
	if o.e2b {
		so.E2B = &e2b.Options{Secret: []byte("test secret")}
	}
	if o.templates != "" {
		so.Config.Server.Builds = o.builds
		so.Builder = newBuilder(t, o, catalog, st, m, im, mt, log)
		so.Templates, so.Catalog = st, catalog
	}
	h.srv = server.New(so)
	// Served as kiln serve serves it: header and idle timeouts, the cap on
	// pending connections.
	h.ts = httptest.NewUnstartedServer(h.srv)
	h.ts.Config = h.srv.HTTPServer(nil)
	if o.header > 0 {
		h.ts.Config.ReadHeaderTimeout = o.header
	}
	h.ts.Start()
	t.Cleanup(func() {
		h.ts.CloseClientConnections()
		h.ts.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, sb := range m.Live() {
			_ = m.Kill(ctx, sb.ID)
		}
		m.Close()
	})
	if so.Builder != nil {
		t.Cleanup(so.Builder.Close) // before the Manager closes: builds end, their sandboxes killed
	}
	return h
}

func runtimes(cfg config.Config) map[string]oci.Runtime {
	return map[string]oci.Runtime{
		"runsc": oci.Runsc(oci.Config{Binary: cfg.RunscPath, Root: filepath.Join(cfg.RunDir, "runsc"), Flags: oci.RunscFlags(context.Background(), cfg.RunscPath, cfg.RunscPlatform)}),
		"runc":  oci.Runc(oci.Config{Binary: cfg.RuncPath, Root: filepath.Join(cfg.RunDir, "runc")}),
	}
}

// with returns h reporting to t (a subtest).
func (h *harness) with(t *testing.T) *harness { return h.withTB(t) }

func (h *harness) withTB(t testing.TB) *harness {
	c := *h
	c.t = t
	return &c
}

func (h *harness) makeKey(name string, admin bool, maxSandboxes int) string {
	h.t.Helper()
	k, secret := apikey.New(name, admin)
	k.MaxSandboxes = maxSandboxes
	if err := h.store.CreateKey(context.Background(), k); err != nil {
		h.t.Fatal(err)
	}
	return secret
}

// request sends a request with key (as Bearer) and returns the response.
func (h *harness) request(method, path, key string, body io.Reader, hdr ...string) *http.Response {
	h.t.Helper()
	req, err := http.NewRequest(method, h.ts.URL+path, body)
	if err != nil {
		h.t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := h.ts.Client().Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	return resp
}

// do sends v as JSON (nil: no body), expects status and decodes the answer
// into out (if not nil).
func (h *harness) do(method, path, key string, v any, status int, out any) {
	h.t.Helper()
	var body io.Reader
	if v != nil {
		b, err := json.Marshal(v)
		if err != nil {
			h.t.Fatal(err)
		}
		body = bytes.NewReader(b)
	}
	resp := h.request(method, path, key, body)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != status {
		h.t.Fatalf("%s %s: status %d, want %d: %s", method, path, resp.StatusCode, status, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			h.t.Fatalf("%s %s: decoding %q: %v", method, path, b, err)
		}
	}
}

// create makes a sandbox with key.
func (h *harness) create(key string, req api.CreateSandboxRequest) api.Sandbox {
	h.t.Helper()
	if req.Runtime == "" {
		req.Runtime = testRuntime()
	}
	var sb api.Sandbox
	h.do("POST", "/v1/sandboxes", key, req, http.StatusCreated, &sb)
	return sb
}

// events reads an NDJSON stream, calling f for each event until it
// returns false or the stream ends.
func readEvents(t *testing.T, r io.Reader, f func(api.Event) bool) {
	t.Helper()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 4<<20)
	for sc.Scan() {
		var ev api.Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("decoding event %q: %v", sc.Bytes(), err)
		}
		if !f(ev) {
			return
		}
	}
}

// apiErr decodes an error response and checks its shape.
func apiErr(t *testing.T, resp *http.Response) api.Error {
	t.Helper()
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var e api.Error
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("error body %q is not an api.Error: %v", b, err)
	}
	if e.Code == "" || e.Message == "" || e.RequestID == "" || e.RequestID != resp.Header.Get("X-Request-Id") {
		t.Errorf("error body %q: want code, message and the X-Request-Id %q", b, resp.Header.Get("X-Request-Id"))
	}
	return e
}

// testWriter logs through t until the test ends (goroutines of the
// Manager may log later).
type testWriter struct {
	t    testing.TB
	done *atomic.Bool
}

func newTestWriter(t testing.TB) testWriter {
	w := testWriter{t: t, done: new(atomic.Bool)}
	t.Cleanup(func() { w.done.Store(true) })
	return w
}

func (w testWriter) Write(p []byte) (int, error) {
	if !w.done.Load() {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}
