package edge_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/apikey"
	"github.com/kiln-sh/kiln/internal/edge"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/store/sqlite"
)

const dataDir = "/var/lib/kiln-edge-test"

// TestProblem: what a client sees of an error served through the edge:
// a classified one keeps its message without host directories and gets
// its class's status; an unclassified one becomes a generic message with
// the request id, and only the log holds the real error.
func TestProblem(t *testing.T) {
	var logs bytes.Buffer
	e := edge.New(edge.Options{Log: slog.New(slog.NewJSONHandler(&logs, nil)), Scrub: []string{dataDir}})
	for _, tc := range []struct {
		name   string
		err    error
		status int
		msg    string // the whole message; for internal errors, its start
		logged bool   // logged as an internal error
	}{
		{"classified", fmt.Errorf("no file %s/sandboxes/x/layer: %w", dataDir, errdefs.ErrNotFound),
			404, "no file …/sandboxes/x/layer: not found", false},
		{"precondition", fmt.Errorf("sandbox is paused: %w", errdefs.ErrFailedPrecondition), 409, "sandbox is paused: failed precondition", false},
		{"body too large", fmt.Errorf("decoding: %w", &http.MaxBytesError{Limit: 10}), 400, "request body larger than 10 bytes", false},
		{"unclassified", fmt.Errorf("syncing %s/sandboxes/x: input/output error", dataDir),
			500, "internal error; the server log has details under request id ", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs.Reset()
			var got *api.Error
			h := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				ae, status := e.Problem(r.Context(), tc.err)
				got = ae
				w.WriteHeader(status)
			}))
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest("GET", "/x", nil))
			id := rec.Header().Get("X-Request-Id")
			if rec.Code != tc.status || got.Code.HTTPStatus() != tc.status {
				t.Errorf("status %d (code %s), want %d", rec.Code, got.Code, tc.status)
			}
			if got.RequestID == "" || got.RequestID != id {
				t.Errorf("request id %q, want the X-Request-Id %q", got.RequestID, id)
			}
			want := tc.msg
			if tc.logged {
				want += id
			}
			if got.Message != want {
				t.Errorf("message %q, want %q", got.Message, want)
			}
			internal := internalLogs(t, &logs)
			switch {
			case !tc.logged && len(internal) > 0:
				t.Errorf("a classified error logged as internal: %v", internal)
			case tc.logged && (len(internal) != 1 || internal[0]["request_id"] != id || internal[0]["err"] != tc.err.Error()):
				t.Errorf("internal errors logged %v, want one with request_id %s and err %q", internal, id, tc.err)
			}
		})
	}
	long := fmt.Errorf("no such path %s: %w", strings.Repeat("x", 100<<10), errdefs.ErrNotFound)
	if ae := e.Public(context.Background(), long); len(ae.Message) > 1100 || !strings.HasSuffix(ae.Message, ": not found") {
		t.Errorf("a 100 KiB message: %d bytes, ending %q", len(ae.Message), ae.Message[max(0, len(ae.Message)-20):])
	}
}

// internalLogs are the "internal error" records of a JSON log.
func internalLogs(t *testing.T, logs *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	dec := json.NewDecoder(logs)
	for {
		var rec map[string]any
		if err := dec.Decode(&rec); errors.Is(err, io.EOF) {
			return out
		} else if err != nil {
			t.Fatal(err)
		}
		if rec["msg"] == "internal error" {
			out = append(out, rec)
		}
	}
}

// TestAuthenticate checks API keys against a real key store: how a key is
// sent, which keys are refused and why, what a caller may hold, and that
// the request log names the key.
func TestAuthenticate(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "kiln.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	admin, adminSecret := apikey.New("admin", true)
	user, userSecret := apikey.New("user", false)
	user.MaxSandboxes = 3
	revoked, revokedSecret := apikey.New("old", false)
	for _, k := range []apikey.Key{admin, user, revoked} {
		if err := st.CreateKey(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.RevokeKey(ctx, revoked.ID, time.Now()); err != nil {
		t.Fatal(err)
	}
	_, unknownSecret := apikey.New("unknown", false)
	defaults := sandbox.Quota{MaxSandboxes: 10, MaxMemoryBytes: 8 << 30}
	var logs bytes.Buffer
	e := edge.New(edge.Options{Keys: st, DefaultQuota: defaults, Log: slog.New(slog.NewJSONHandler(&logs, nil))})

	for _, tc := range []struct {
		name    string
		header  map[string]string
		role    edge.Role
		want    error // a class, or nil
		key     string
		quota   sandbox.Quota
		message string // part of the error's
	}{
		{"bearer", map[string]string{"Authorization": "Bearer " + userSecret}, edge.AnyKey, nil, user.ID,
			sandbox.Quota{MaxSandboxes: 3, MaxMemoryBytes: 8 << 30}, ""},
		{"X-API-Key", map[string]string{"X-API-Key": adminSecret}, edge.AdminKey, nil, admin.ID, defaults, ""},
		{"none", nil, edge.AnyKey, errdefs.ErrUnauthenticated, "", sandbox.Quota{}, "missing API key"},
		{"basic", map[string]string{"Authorization": "Basic dXNlcjo="}, edge.AnyKey, errdefs.ErrUnauthenticated, "", sandbox.Quota{}, "want Bearer"},
		{"malformed", map[string]string{"X-API-Key": "e2b_nothex"}, edge.AnyKey, errdefs.ErrUnauthenticated, "", sandbox.Quota{}, "malformed"},
		{"unknown", map[string]string{"X-API-Key": unknownSecret}, edge.AnyKey, errdefs.ErrUnauthenticated, "", sandbox.Quota{}, "unknown or revoked"},
		{"revoked", map[string]string{"X-API-Key": revokedSecret}, edge.AnyKey, errdefs.ErrUnauthenticated, "", sandbox.Quota{}, "unknown or revoked"},
		{"not admin", map[string]string{"X-API-Key": userSecret}, edge.AdminKey, errdefs.ErrPermissionDenied, "", sandbox.Quota{}, "admin key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs.Reset()
			var c edge.Caller
			var err error
			var logged string
			h := e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				c, err = e.Authenticate(r, tc.role)
				logged = edge.Key(r.Context()).ID
			}))
			r := httptest.NewRequest("GET", "/", nil)
			for k, v := range tc.header {
				r.Header.Set(k, v)
			}
			h.ServeHTTP(httptest.NewRecorder(), r)
			switch {
			case tc.want == nil && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != nil && (!errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.message)):
				t.Fatalf("error %v, want %v with %q", err, tc.want, tc.message)
			}
			if c.Key.ID != tc.key || c.Quota != tc.quota || logged != tc.key {
				t.Errorf("caller %s (recorded %q) with quota %+v, want %q with %+v", c.Key.ID, logged, c.Quota, tc.key, tc.quota)
			}
			if tc.key != "" && !strings.Contains(logs.String(), `"key_id":"`+tc.key+`"`) {
				t.Errorf("the request log does not name key %s: %s", tc.key, logs.String())
			}
		})
	}

	var none *edge.Edge // a front end without a server (no keys)
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("X-API-Key", userSecret)
	if _, err := none.Authenticate(r, edge.AnyKey); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("a nil edge: %v, want unauthenticated", err)
	}
}
