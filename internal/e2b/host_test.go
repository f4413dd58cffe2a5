package e2b_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/kiln-sh/kiln/internal/e2b"
)

// TestBadHosts: a host under the sandboxes' domain that names no sandbox
// port is E2B's and answered 404 (not Kiln's API, not a crash); hosts
// outside the domain stay the API's unless they name a sandbox port.
func TestBadHosts(t *testing.T) {
	h := e2b.New(e2b.Options{Domain: "kiln.localhost:8420"})
	for _, tc := range []struct {
		host   string
		routed bool
		status int // when routed and not a sandbox port
	}{
		{"kiln.localhost:8420", false, 0},
		{"127.0.0.1:8420", false, 0},
		{"api.example.com", false, 0},
		{"www.kiln.localhost:8420", true, http.StatusNotFound},
		{"WWW.Kiln.Localhost.", true, http.StatusNotFound},
		{"0-abcdefgh.kiln.localhost:8420", true, http.StatusNotFound},
		{"99999-abcdefgh.kiln.localhost:8420", true, http.StatusNotFound},
		{"8000-abc_def.kiln.localhost:8420", true, http.StatusNotFound},
		{"8000-.kiln.localhost:8420", true, http.StatusNotFound},
		{"-8000-abcdefgh.kiln.localhost", true, http.StatusNotFound},
		{"a.b.c.kiln.localhost:1", true, http.StatusNotFound},
		{"8000-abcdefgh.other.test", true, 0}, // a sandbox port on any domain, as before
	} {
		r := httptest.NewRequest("GET", "/v1/sandboxes", nil)
		r.Host = tc.host
		if got := h.Routed(r); got != tc.routed {
			t.Errorf("%s: Routed = %v, want %v", tc.host, got, tc.routed)
		}
		if tc.status == 0 {
			continue
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		var body struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil || w.Code != tc.status || body.Code != tc.status {
			t.Errorf("%s: %d %s, want %d with E2B's error JSON", tc.host, w.Code, w.Body, tc.status)
		}
	}
	// Without a domain, only sandbox-port hosts are E2B's.
	r := httptest.NewRequest("GET", "/v1/sandboxes", nil)
	r.Host = "www.kiln.localhost:8420"
	if e2b.New(e2b.Options{}).Routed(r) {
		t.Errorf("no domain: %s routed to E2B", r.Host)
	}
}
