package edge_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/kiln-sh/kiln/internal/edge"
)

// TestAdoptRequestID: a well-formed id from another Kiln process becomes
// the request's (its log, its errors, its X-Request-Id); anything else
// leaves the edge's own.
func TestAdoptRequestID(t *testing.T) {
	for _, tc := range []struct {
		in    string
		adopt bool
	}{
		{"0123456789abcdef", true},
		{"", false},
		{"0123456789abcde", false},
		{"0123456789abcdeX", false},
		{"0123456789abcdef0", false},
		{"\n0123456789abcde", false},
	} {
		var seen string
		h := edge.New(edge.Options{}).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			edge.AdoptRequestID(w, r, tc.in)
			seen = edge.RequestID(r.Context())
		}))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
		got := rec.Header().Get("X-Request-Id")
		if got != seen {
			t.Errorf("AdoptRequestID(%q): header %q, context %q; want the same", tc.in, got, seen)
		}
		if (got == tc.in) != tc.adopt {
			t.Errorf("AdoptRequestID(%q): id %q, adopted = %v, want %v", tc.in, got, got == tc.in, tc.adopt)
		}
	}
}
