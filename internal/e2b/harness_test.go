package e2b_test

import (
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

	"github.com/kiln-sh/kiln/internal/apikey"
	"github.com/kiln-sh/kiln/internal/e2b"
	"github.com/kiln-sh/kiln/internal/metrics"
	"github.com/kiln-sh/kiln/internal/oci/ocitest"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/sandbox/sandboxtest"
	"github.com/kiln-sh/kiln/internal/server"
	"github.com/kiln-sh/kiln/internal/template"
)

// agentPath is a kiln-agent built once for the package's tests.
var agentPath string

func TestMain(m *testing.M) { os.Exit(sandboxtest.Main(m, &agentPath)) }

// testRuntime is the runtime of the tests' sandboxes (E2B's API has no
// runtime choice, so it is the server's default).
func testRuntime() string {
	if rt := os.Getenv("KILN_TEST_RUNTIME"); rt != "" {
		return rt
	}
	return "runsc"
}

// harness is a real kiln server (Manager, SQLite store, keys) with E2B's
// API mounted, as kiln serve runs it.
type harness struct {
	t      testing.TB
	m      *sandbox.Manager
	ts     *httptest.Server
	secret []byte
	a, b   string        // API keys of two tenants
	one    string        // a tenant that may have one sandbox at a time
	store  sandbox.Store // the Manager's
	keys   apikey.Store
	// serve starts another server on the same Manager, store and keys,
	// as a restarted kiln serve (with nothing kept in memory) would be.
	serve func() *httptest.Server
}

// newHarness starts a server; it skips (or fails under CI) without root
// or the templates the test needs.
func newHarness(t testing.TB, templates ...string) *harness {
	t.Helper()
	cfg := sandboxtest.Config(t, agentPath)
	cfg.Runtime = testRuntime()
	for _, name := range templates {
		_, err := template.Lookup(cfg.DataDir, name)
		ocitest.Require(t, err == nil, fmt.Sprintf("template %s not built (make setup): %v", name, err))
	}
	_, err := exec.LookPath(cfg.Runtime)
	ocitest.Require(t, err == nil, cfg.Runtime+" not installed")
	keys, ok := cfg.Store.(apikey.Store)
	if !ok {
		t.Fatalf("the test store %T keeps no API keys", cfg.Store)
	}
	m, im := sandboxtest.NewManagerImages(t, cfg)
	secret, err := e2b.LoadSecret(filepath.Join(t.TempDir(), "e2b.secret"))
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, m: m, secret: secret, store: cfg.Store, keys: keys}
	for i, k := range []*string{&h.a, &h.b, &h.one} {
		key, s := apikey.New("tenant", false)
		if i == 2 {
			key.MaxSandboxes = 1
		}
		if err := keys.CreateKey(context.Background(), key); err != nil {
			t.Fatal(err)
		}
		*k = s
	}
	h.serve = func() *httptest.Server {
		srv := server.New(server.Options{
			Manager: m, Images: im, Keys: keys, Log: slog.New(slog.NewTextHandler(newTestWriter(t), nil)), Metrics: metrics.New(m),
			Config: cfg.Config, Version: "test", E2B: &e2b.Options{Secret: secret},
		})
		ts := httptest.NewServer(srv)
		t.Cleanup(func() { // before the Manager's cleanup kills the sandboxes
			ts.CloseClientConnections()
			ts.Close()
		})
		return ts
	}
	h.ts = h.serve()
	return h
}

func (h *harness) with(t *testing.T) *harness {
	c := *h
	c.t = t
	return &c
}

// call sends a request with JSON body v (nil: none) and headers given as
// pairs, and returns the status, headers and body.
func (h *harness) call(method, path string, v any, hdr ...string) (int, http.Header, []byte) {
	h.t.Helper()
	var body io.Reader
	if v != nil {
		b, err := json.Marshal(v)
		if err != nil {
			h.t.Fatal(err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, h.ts.URL+path, body)
	if err != nil {
		h.t.Fatal(err)
	}
	return h.do(req, hdr...)
}

// do sends req with headers given as pairs ("Host" sets the host) and
// returns the status, headers and body.
func (h *harness) do(req *http.Request, hdr ...string) (int, http.Header, []byte) {
	h.t.Helper()
	for i := 0; i+1 < len(hdr); i += 2 {
		if strings.EqualFold(hdr[i], "Host") {
			req.Host = hdr[i+1]
			continue
		}
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := h.ts.Client().Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, b
}

// api calls the control plane with key and expects status; it decodes
// the answer into out (if not nil).
func (h *harness) api(method, path, key string, v any, status int, out any) http.Header {
	h.t.Helper()
	got, hdr, b := h.call(method, path, v, "X-API-KEY", key)
	if got != status {
		h.t.Fatalf("%s %s: status %d, want %d: %s", method, path, got, status, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			h.t.Fatalf("%s %s: decoding %q: %v", method, path, b, err)
		}
	}
	return hdr
}

// sandboxJSON is E2B's Sandbox as the SDKs decode it.
type sandboxJSON struct {
	SandboxID          string  `json:"sandboxID"`
	TemplateID         string  `json:"templateID"`
	Alias              string  `json:"alias"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

// create makes a sandbox through POST /v2/sandboxes.
func (h *harness) create(key string, body map[string]any) sandboxJSON {
	h.t.Helper()
	var sb sandboxJSON
	h.api("POST", "/v2/sandboxes", key, body, http.StatusCreated, &sb)
	return sb
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
