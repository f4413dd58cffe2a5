package server

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/kiln-sh/kiln/internal/apikey"
	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/store/sqlite"
)

// TestAnonymousCap: requests served without credentials are capped;
// beyond the cap a public route answers 429 and closes the connection,
// while a request with a key is served; the slots come back when the
// requests end.
func TestAnonymousCap(t *testing.T) {
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "kiln.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	k, admin := apikey.New("admin", true)
	if err := st.CreateKey(context.Background(), k); err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.Server.Edge.MaxAnonymous = 3
	s := New(Options{Keys: st, Config: cfg})
	ts := httptest.NewUnstartedServer(s)
	ts.Config = s.HTTPServer(nil)
	ts.Start()
	defer ts.Close()

	get := func(path, key string) (int, bool) {
		t.Helper()
		req, _ := http.NewRequest("GET", ts.URL+path, nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, resp.Close
	}
	if status, _ := get("/healthz", ""); status != http.StatusOK {
		t.Fatalf("GET /healthz: %d", status)
	}

	// Three anonymous requests in flight (as a slow public port's would
	// be) hold the slots.
	var held []*http.Request
	for range 3 {
		r := s.edge.Begin(httptest.NewRequest("GET", "/", nil))
		if err := s.edge.Admit(r, false); err != nil {
			t.Fatalf("admitting anonymous request %d of 3: %v", len(held)+1, err)
		}
		held = append(held, r)
	}
	r := s.edge.Begin(httptest.NewRequest("GET", "/", nil))
	if err := s.edge.Admit(r, false); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("a fourth anonymous request: %v, want resource exhausted", err)
	}
	if err := s.edge.Admit(r, true); err != nil {
		t.Errorf("a credentialed request: %v, want it admitted", err)
	}
	if status, closed := get("/healthz", ""); status != http.StatusTooManyRequests || !closed {
		t.Errorf("GET /healthz beyond the cap: %d (closed %v), want 429 and the connection closed", status, closed)
	}
	if status, _ := get("/nowhere", ""); status != http.StatusTooManyRequests {
		t.Errorf("GET /nowhere beyond the cap: %d, want 429", status)
	}
	if status, _ := get("/v1/keys", admin); status != http.StatusOK {
		t.Errorf("GET /v1/keys with a key beyond the cap: %d, want 200", status)
	}
	if status, closed := get("/v1/keys", ""); status != http.StatusUnauthorized || !closed {
		t.Errorf("GET /v1/keys without a key: %d (closed %v), want 401 and the connection closed", status, closed)
	}
	for _, r := range held {
		s.edge.End(r)
	}
	if status, _ := get("/healthz", ""); status != http.StatusOK {
		t.Errorf("GET /healthz once the slots are free: %d", status)
	}
	if n := s.edge.AnonymousHeld(); n != 0 {
		t.Errorf("%d anonymous slots still held after every request ended", n)
	}
}
