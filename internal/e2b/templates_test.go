package e2b_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/internal/apikey"
	"github.com/kiln-sh/kiln/internal/e2b"
	"github.com/kiln-sh/kiln/internal/metrics"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/sandbox/sandboxtest"
	"github.com/kiln-sh/kiln/internal/server"
	"github.com/kiln-sh/kiln/internal/store/sqlite"
	"github.com/kiln-sh/kiln/internal/template"
	"github.com/kiln-sh/kiln/internal/template/builder"
	"github.com/kiln-sh/kiln/internal/template/layer"
)

// uploadLimit is the template harness's largest upload.
const uploadLimit = 4096

// newTemplateHarness is newHarness with E2B's template API: a builder
// (build sandboxes without network, uploads of at most uploadLimit bytes)
// in a data dir of the test's own that shares the built-in templates.
func newTemplateHarness(t *testing.T) *harness {
	t.Helper()
	cfg := sandboxtest.Config(t, agentPath)
	cfg.Runtime = testRuntime()
	st := cfg.Store.(*sqlite.Store)
	dir := filepath.Join(t.TempDir(), "data")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(template.Dir(cfg.DataDir), template.Dir(dir)); err != nil {
		t.Fatal(err)
	}
	catalog := &template.Catalog{DataDir: dir, Store: st}
	cfg.Catalog = catalog
	m, im := sandboxtest.NewManagerImages(t, cfg)
	layers, err := layer.Open(filepath.Join(dir, "layers"))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(newTestWriter(t), nil))
	bld, err := builder.New(context.Background(), builder.Config{DataDir: dir, Records: st, Layers: layers, Catalog: catalog,
		Sandboxes: m, Images: im, Network: sandbox.NetworkNone, MaxContextBytes: uploadLimit, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(bld.Close)
	secret, err := e2b.LoadSecret(filepath.Join(t.TempDir(), "e2b.secret"))
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, m: m, secret: secret, store: st, keys: st}
	for _, k := range []*string{&h.a, &h.b} {
		key, s := apikey.New("tenant", false)
		if err := st.CreateKey(context.Background(), key); err != nil {
			t.Fatal(err)
		}
		*k = s
	}
	srv := server.New(server.Options{Manager: m, Images: im, Keys: st, Log: log, Metrics: metrics.New(m), Config: cfg.Config,
		Version: "test", E2B: &e2b.Options{Secret: secret}, Builder: bld, Templates: st, Catalog: catalog})
	h.ts = httptest.NewServer(srv)
	t.Cleanup(func() {
		h.ts.CloseClientConnections()
		h.ts.Close()
	})
	return h
}

type buildRequested struct {
	TemplateID string   `json:"templateID"`
	BuildID    string   `json:"buildID"`
	Names      []string `json:"names"`
	Tags       []string `json:"tags"`
}

type buildStatus struct {
	Status     string `json:"status"`
	LogEntries []struct {
		Level, Message, Step string
	} `json:"logEntries"`
	Reason *struct{ Message, Step string } `json:"reason"`
}

// waitBuild polls a build's status as the SDK does until it ends.
func (h *harness) waitBuild(key, name, id string) buildStatus {
	h.t.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var st buildStatus
		h.api("GET", "/templates/"+name+"/builds/"+id+"/status", key, nil, http.StatusOK, &st)
		if st.Status == "ready" || st.Status == "error" {
			return st
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("build %s still %s after 5 minutes", id, st.Status)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestTemplateAPIInput covers what the SDKs cannot send: bad names, tags,
// hashes, signatures and steps, uploads over the limit, and another key's
// templates and builds (404, as its sandboxes).
func TestTemplateAPIInput(t *testing.T) {
	h := newTemplateHarness(t)
	errCode := func(status int, body []byte) {
		t.Helper()
		var e errorJSON
		if err := json.Unmarshal(body, &e); err != nil || e.Code != status || e.Message == "" {
			t.Errorf("error body %q: want E2B's {code: %d, message}", body, status)
		}
	}

	for _, c := range []struct {
		name string
		body any
	}{
		{"no name", map[string]any{}},
		{"bad name", map[string]any{"name": "Not A Name"}},
		{"bad tag", map[string]any{"name": "ok", "tags": []string{"no/slash"}}},
		{"built-in name", map[string]any{"name": "code-interpreter-v1"}},
		{"cpus over the limit", map[string]any{"name": "ok", "cpuCount": 1000}},
		{"not JSON", "{"},
	} {
		t.Run("request/"+c.name, func(t *testing.T) {
			st, _, b := h.with(t).call("POST", "/v3/templates", c.body, "X-API-KEY", h.a)
			if st != http.StatusBadRequest {
				t.Fatalf("status %d, want 400: %s", st, b)
			}
			errCode(http.StatusBadRequest, b)
		})
	}

	var req buildRequested
	h.api("POST", "/v3/templates", h.a, map[string]any{"name": "tpl:v1", "tags": []string{"v1", "extra"}}, http.StatusAccepted, &req)
	if req.TemplateID != "tpl" || strings.Join(req.Tags, ",") != "v1,extra" || strings.Join(req.Names, ",") != "tpl:v1,tpl:extra" {
		t.Fatalf("POST /v3/templates answered %+v", req)
	}
	build := "/v2/templates/tpl/builds/" + req.BuildID

	// Files: the hash must be a SHA-256; the template the caller's.
	hash := strings.Repeat("ab", 32)
	for _, c := range []struct {
		path, key string
		status    int
	}{
		{"/templates/tpl/files/xyz", h.a, http.StatusBadRequest},
		{"/templates/tpl/files/" + strings.Repeat("AB", 32), h.a, http.StatusBadRequest},
		{"/templates/nosuch/files/" + hash, h.a, http.StatusNotFound},
		{"/templates/tpl/files/" + hash, h.b, http.StatusNotFound},
	} {
		st, _, b := h.call("GET", c.path, nil, "X-API-KEY", c.key)
		if st != c.status {
			t.Errorf("GET %s: status %d, want %d: %s", c.path, st, c.status, b)
		}
	}
	var link struct {
		Present bool   `json:"present"`
		URL     string `json:"url"`
	}
	h.api("GET", "/templates/tpl/files/"+hash, h.a, nil, http.StatusCreated, &link)
	if link.Present || !strings.HasPrefix(link.URL, h.ts.URL+"/templates/tpl/files/"+hash+"?") {
		t.Fatalf("upload link %+v", link)
	}
	// Behind a proxy (a cluster's front), the link names the host the
	// client asked; a forwarded host that is not a plain host is ignored.
	for fh, want := range map[string]string{"front.example:8443": "http://front.example:8443/", "evil.example/x?": h.ts.URL + "/"} {
		_, _, b := h.call("GET", "/templates/tpl/files/"+hash, nil, "X-API-KEY", h.a, "X-Forwarded-Host", fh)
		var l struct{ URL string }
		if err := json.Unmarshal(b, &l); err != nil || !strings.HasPrefix(l.URL, want+"templates/tpl/files/") {
			t.Errorf("upload link with X-Forwarded-Host %q: %s, want %s…", fh, b, want)
		}
	}
	put := func(url string, body []byte) (int, []byte) {
		req, err := http.NewRequest("PUT", url, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		st, _, b := h.do(req)
		return st, b
	}
	if st, b := put(strings.Replace(link.URL, "signature=", "signature=0", 1), []byte("x")); st != http.StatusForbidden {
		t.Errorf("PUT with a bad signature: status %d, want 403: %s", st, b)
	}
	if st, b := put(link.URL, make([]byte, uploadLimit+1)); st != http.StatusRequestEntityTooLarge {
		t.Errorf("PUT over the limit: status %d, want 413: %s", st, b)
	} else {
		errCode(http.StatusRequestEntityTooLarge, b)
	}
	if st, b := put(link.URL, []byte("not a tar, but stored")); st != http.StatusOK {
		t.Fatalf("PUT: status %d, want 200: %s", st, b)
	}
	h.api("GET", "/templates/tpl/files/"+hash, h.a, nil, http.StatusCreated, &link)
	if !link.Present {
		t.Error("the uploaded files are not present")
	}

	// Malformed recipes are refused before anything runs; the build
	// waits for a good one.
	for _, c := range []struct {
		name string
		body any
	}{
		{"unknown step", map[string]any{"fromTemplate": "base", "steps": []any{map[string]any{"type": "FOO", "args": []string{"x"}}}}},
		{"RUN without a command", map[string]any{"fromTemplate": "base", "steps": []any{map[string]any{"type": "RUN"}}}},
		{"COPY without files", map[string]any{"fromTemplate": "base", "steps": []any{map[string]any{"type": "COPY", "args": []string{"a", "/a"}}}}},
		{"ENV odd args", map[string]any{"fromTemplate": "base", "steps": []any{map[string]any{"type": "ENV", "args": []string{"K"}}}}},
		{"unknown base template", map[string]any{"fromTemplate": "nosuch"}},
		{"two bases", map[string]any{"fromTemplate": "base", "fromImage": "debian"}},
		{"cloud registry", map[string]any{"fromImage": "x/y", "fromImageRegistry": map[string]any{"type": "aws"}}},
		{"ready without start", map[string]any{"fromTemplate": "base", "readyCmd": "true"}},
		{"steps not a list", map[string]any{"fromTemplate": "base", "steps": "RUN x"}},
	} {
		t.Run("start/"+c.name, func(t *testing.T) {
			st, _, b := h.with(t).call("POST", build, c.body, "X-API-KEY", h.a)
			if st != http.StatusBadRequest {
				t.Fatalf("status %d, want 400: %s", st, b)
			}
			errCode(http.StatusBadRequest, b)
		})
	}
	var waiting buildStatus
	h.api("GET", "/templates/tpl/builds/"+req.BuildID+"/status", h.a, nil, http.StatusOK, &waiting)
	if waiting.Status != "waiting" {
		t.Fatalf("after refused recipes the build is %s, want waiting", waiting.Status)
	}

	// Another key sees none of it.
	for _, c := range []struct{ method, path string }{
		{"POST", build},
		{"GET", "/templates/tpl/builds/" + req.BuildID + "/status"},
	} {
		st, _, b := h.call(c.method, c.path, map[string]any{"fromTemplate": "base"}, "X-API-KEY", h.b)
		if st != http.StatusNotFound {
			t.Errorf("%s %s with another key: status %d, want 404: %s", c.method, c.path, st, b)
		}
	}

	// A build with no RUN step needs no sandbox: ready at once.
	h.api("POST", build, h.a, map[string]any{"fromImage": "e2bdev/base", "steps": []any{
		map[string]any{"type": "ENV", "args": []string{"K", "v"}}}}, http.StatusAccepted, nil)
	if st := h.waitBuild(h.a, "tpl", req.BuildID); st.Status != "ready" {
		t.Fatalf("build: %+v", st)
	}
	if st, _, b := h.call("POST", build, map[string]any{"fromTemplate": "base"}, "X-API-KEY", h.a); st != http.StatusConflict {
		t.Errorf("starting a finished build again: status %d, want 409: %s", st, b)
	}
	h.api("GET", "/templates/aliases/tpl", h.a, nil, http.StatusOK, nil)
	for _, c := range []struct{ method, path string }{
		{"GET", "/templates/aliases/tpl"},
		{"GET", "/templates/tpl/tags"},
		{"PATCH", "/v2/templates/tpl"},
		{"DELETE", "/templates/tpl"},
	} {
		st, _, b := h.call(c.method, c.path, map[string]any{"public": true}, "X-API-KEY", h.b)
		if st != http.StatusNotFound {
			t.Errorf("%s %s with another key: status %d, want 404: %s", c.method, c.path, st, b)
		}
	}
	var list []struct {
		TemplateID string   `json:"templateID"`
		Names      []string `json:"names"`
	}
	h.api("GET", "/v2/templates", h.b, nil, http.StatusOK, &list)
	if len(list) != 0 {
		t.Errorf("another key lists %+v", list)
	}
	h.api("GET", "/templates", h.a, nil, http.StatusOK, &list)
	if len(list) != 1 || list[0].TemplateID != "tpl" || strings.Join(list[0].Names, ",") != "tpl:extra,tpl:v1" {
		t.Errorf("the owner lists %+v", list)
	}
	// Public: every key may use it, only its owner change it.
	h.api("PATCH", "/v2/templates/tpl", h.a, map[string]any{"public": true}, http.StatusOK, nil)
	h.api("GET", "/templates/aliases/tpl", h.b, nil, http.StatusOK, nil)
	if st, _, b := h.call("DELETE", "/templates/tpl", nil, "X-API-KEY", h.b); st != http.StatusForbidden {
		t.Errorf("deleting another key's public template: status %d, want 403: %s", st, b)
	}
	h.api("DELETE", "/templates/tpl", h.a, nil, http.StatusNoContent, nil)
	h.api("GET", "/templates/aliases/tpl", h.a, nil, http.StatusNotFound, nil)
}

// TestTemplateBuildFailure: a failed step's reason and number reach the
// status as E2B's SDK reads them.
func TestTemplateBuildFailure(t *testing.T) {
	h := newTemplateHarness(t)
	var req buildRequested
	h.api("POST", "/v3/templates", h.a, map[string]any{"name": "broken"}, http.StatusAccepted, &req)
	h.api("POST", "/v2/templates/broken/builds/"+req.BuildID, h.a, map[string]any{"fromTemplate": "base", "steps": []any{
		map[string]any{"type": "ENV", "args": []string{"K", "v"}},
		map[string]any{"type": "RUN", "args": []string{"echo no luck; exit 7", ""}},
	}}, http.StatusAccepted, nil)
	st := h.waitBuild(h.a, "broken", req.BuildID)
	if st.Status != "error" || st.Reason == nil || st.Reason.Step != "2" ||
		!strings.Contains(st.Reason.Message, "step 2 (RUN): the command exited with status 7") ||
		!strings.Contains(st.Reason.Message, "no luck") {
		t.Fatalf("status %+v, want error at step 2 with the exit status and output", st)
	}
}
