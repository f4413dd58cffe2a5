package e2b_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/internal/apikey"
	"github.com/kiln-sh/kiln/internal/e2b"
	"github.com/kiln-sh/kiln/internal/metrics"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/sandbox/sandboxtest"
	"github.com/kiln-sh/kiln/internal/server"
)

// TestCreateMetadataCaps: E2B's creates (v1 and v2) refuse metadata over
// Kiln's caps, and env over its total, with a 400 and a short message.
func TestCreateMetadataCaps(t *testing.T) {
	h := newHarness(t)
	many := map[string]string{}
	for i := range sandbox.MaxMetadataPairs + 1 {
		many[fmt.Sprintf("k%03d", i)] = "v"
	}
	big := map[string]string{}
	for i := range 5 {
		big[fmt.Sprintf("k%d", i)] = strings.Repeat("v", 4<<10)
	}
	for _, tc := range []struct {
		name string
		body map[string]any
	}{
		{"65 pairs", map[string]any{"metadata": many}},
		{"key of 257 bytes", map[string]any{"metadata": map[string]string{strings.Repeat("k", 257): "v"}}},
		{"value of 4 KiB + 1", map[string]any{"metadata": map[string]string{"k": strings.Repeat("v", 4<<10+1)}}},
		{"20 KiB in all", map[string]any{"metadata": big}},
		{"env of 90 KiB", map[string]any{"envVars": map[string]string{"A": strings.Repeat("a", 30<<10), "B": strings.Repeat("b", 30<<10), "C": strings.Repeat("c", 30<<10)}}},
	} {
		for _, path := range []string{"/sandboxes", "/v2/sandboxes"} {
			t.Run(tc.name+" "+path, func(t *testing.T) {
				h := h.with(t)
				body := map[string]any{"templateID": "base", "timeout": 60}
				for k, v := range tc.body {
					body[k] = v
				}
				var e errorJSON
				h.api("POST", path, h.a, body, http.StatusBadRequest, &e)
				if e.Code != 400 || len(e.Message) > 200 || strings.Contains(e.Message, strings.Repeat("v", 64)) {
					t.Errorf("error %+v, want a short 400", e)
				}
			})
		}
	}
}

// TestListBounded fills the store with more of one tenant's records than
// pages allow (running ones the list shows, ended ones it does not): v2
// answers pages of at most E2B's 100 with X-Next-Token, in start order
// either way, and the pages add up to every live record once; v1 answers
// the running ones in one bounded page.
func TestListBounded(t *testing.T) {
	h, counted := newCountingHarness(t)
	ctx := context.Background()
	k, secret := apikey.New("many", false)
	if err := h.keys.CreateKey(ctx, k); err != nil {
		t.Fatal(err)
	}
	const live, ended = 250, 1000
	start := time.Now().Add(-time.Hour).UTC()
	for i := range live + ended {
		sb := sandbox.Sandbox{ID: sandbox.ID(fmt.Sprintf("bound%07d", i)), Template: "base", Runtime: "runsc",
			State: sandbox.StateRunning, Owner: k.ID, CreatedAt: start.Add(time.Duration(i) * time.Second),
			ExpiresAt: start.Add(2 * time.Hour), Metadata: map[string]string{"n": fmt.Sprint(i % 2)}}
		if i >= live {
			sb.State, sb.Reason = sandbox.StateStopped, "killed"
		}
		if err := h.store.PutSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	for _, order := range []string{"desc", "asc"} {
		t.Run(order, func(t *testing.T) {
			h := h.with(t)
			var ids []string
			q := "?order=" + order
			for pages := 0; ; pages++ {
				if pages > live/100+1 {
					t.Fatal("more pages than records allow")
				}
				var page []listedJSON
				hdr := h.api("GET", "/v2/sandboxes"+q, secret, nil, http.StatusOK, &page)
				if len(page) > 100 {
					t.Fatalf("page of %d, at most 100", len(page))
				}
				for _, sb := range page {
					ids = append(ids, sb.SandboxID)
				}
				if c, rows := counted.take(); c != 1 || rows > 101 {
					t.Fatalf("one page read %d store pages of up to %d records; want one of at most 101", c, rows)
				}
				next := hdr.Get("X-Next-Token")
				if next == "" {
					break
				}
				q = "?order=" + order + "&nextToken=" + url.QueryEscape(next)
			}
			if len(ids) != live {
				t.Fatalf("pages listed %d sandboxes, want the %d running", len(ids), live)
			}
			for i, id := range ids {
				want := i
				if order == "desc" {
					want = live - 1 - i
				}
				if id != fmt.Sprintf("bound%07d", want) {
					t.Fatalf("position %d: %s, want bound%07d", i, id, want)
				}
			}
		})
	}
	h.api("GET", "/v2/sandboxes?limit=101", secret, nil, http.StatusBadRequest, nil)
	// Filters apply in the query, on every page.
	after := url.QueryEscape(start.Add(199*time.Second + time.Millisecond).Format(time.RFC3339Nano))
	var page []listedJSON
	h.api("GET", "/v2/sandboxes?limit=100&startedAfter="+after, secret, nil, http.StatusOK, &page)
	if len(page) != 50 || page[0].SandboxID != "bound0000249" {
		t.Errorf("startedAfter: %d sandboxes from %v; want the newest 50", len(page), firstID(page))
	}
	counted.take()
	var v1 []listedJSON
	h.api("GET", "/sandboxes?metadata="+sdkMetadata(map[string]string{"n": "1"}), secret, nil, http.StatusOK, &v1)
	if len(v1) != live/2 {
		t.Errorf("v1 list: %d sandboxes, want %d", len(v1), live/2)
	}
	if c, rows := counted.take(); c != 1 || rows > 1001 {
		t.Errorf("v1 list read %d store pages of up to %d records; want one of at most 1001", c, rows)
	}
}

// countingStore counts the store pages the Manager reads and the most
// records one of them held.
type countingStore struct {
	sandbox.Store
	mu          sync.Mutex
	calls, rows int
}

func (s *countingStore) ListSandboxes(ctx context.Context, f sandbox.Filter) ([]sandbox.Sandbox, string, error) {
	sbs, next, err := s.Store.ListSandboxes(ctx, f)
	s.mu.Lock()
	s.calls++
	s.rows = max(s.rows, len(sbs))
	s.mu.Unlock()
	return sbs, next, err
}

// take returns and resets the counts.
func (s *countingStore) take() (calls, rows int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	calls, rows = s.calls, s.rows
	s.calls, s.rows = 0, 0
	return calls, rows
}

// newCountingHarness is newHarness whose Manager reads its store through
// a countingStore.
func newCountingHarness(t *testing.T) (*harness, *countingStore) {
	cfg := sandboxtest.Config(t, agentPath)
	cfg.Runtime = testRuntime()
	keys := cfg.Store.(apikey.Store)
	counted := &countingStore{Store: cfg.Store}
	cfg.Store = counted
	m, im := sandboxtest.NewManagerImages(t, cfg)
	counted.take() // whatever starting the Manager read
	secret, err := e2b.LoadSecret(filepath.Join(t.TempDir(), "e2b.secret"))
	if err != nil {
		t.Fatal(err)
	}
	srv := server.New(server.Options{
		Manager: m, Images: im, Keys: keys, Log: slog.New(slog.NewTextHandler(newTestWriter(t), nil)), Metrics: metrics.New(m),
		Config: cfg.Config, Version: "test", E2B: &e2b.Options{Secret: secret},
	})
	ts := httptest.NewServer(srv)
	t.Cleanup(func() {
		ts.CloseClientConnections()
		ts.Close()
	})
	return &harness{t: t, m: m, ts: ts, secret: secret, store: counted.Store, keys: keys}, counted
}

func firstID(l []listedJSON) string {
	if len(l) == 0 {
		return "none"
	}
	return l[0].SandboxID
}
