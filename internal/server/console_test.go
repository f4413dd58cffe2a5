package server_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/apikey"
	"github.com/kiln-sh/kiln/internal/cluster"
	"github.com/kiln-sh/kiln/internal/console"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// TestConsoleRoutes: the console's page is served under /console/ with its
// CSP and without a key; a browser's GET / is sent there while an API
// client's GET / (and any other method) still gets the JSON 404 it got
// before the console.
func TestConsoleRoutes(t *testing.T) {
	h := newHarness(t, false, harnessOpts{})
	for _, tc := range []struct {
		method, path, accept string
		status               int
		location, ctype      string
	}{
		{"GET", "/", "text/html,application/xhtml+xml,*/*;q=0.8", http.StatusFound, "/console/", ""},
		{"GET", "/", "", http.StatusNotFound, "", "application/json"},
		{"GET", "/", "application/json", http.StatusNotFound, "", "application/json"},
		{"POST", "/", "text/html", http.StatusNotFound, "", "application/json"},
		{"GET", "/nope", "text/html", http.StatusNotFound, "", "application/json"},
		{"GET", "/console/", "", http.StatusOK, "", "text/html; charset=utf-8"},
		{"GET", "/console/app.js", "", http.StatusOK, "", "text/javascript; charset=utf-8"},
		{"GET", "/console/vendor/xterm.js", "", http.StatusOK, "", "text/javascript; charset=utf-8"},
		{"GET", "/console/missing.js", "", http.StatusNotFound, "", "application/json"},
		{"POST", "/console/", "", http.StatusMethodNotAllowed, "", "application/json"},
	} {
		req, err := http.NewRequest(tc.method, h.ts.URL+tc.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if tc.accept != "" {
			req.Header.Set("Accept", tc.accept)
		}
		resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		name := tc.method + " " + tc.path + " (" + tc.accept + ")"
		if resp.StatusCode != tc.status {
			t.Errorf("%s: status %d, want %d: %s", name, resp.StatusCode, tc.status, body)
		}
		if got := resp.Header.Get("Location"); got != tc.location {
			t.Errorf("%s: Location %q, want %q", name, got, tc.location)
		}
		if tc.ctype != "" && resp.Header.Get("Content-Type") != tc.ctype {
			t.Errorf("%s: Content-Type %q, want %q", name, resp.Header.Get("Content-Type"), tc.ctype)
		}
		if tc.status == http.StatusOK && resp.Header.Get("Content-Security-Policy") != console.CSP {
			t.Errorf("%s: CSP %q", name, resp.Header.Get("Content-Security-Policy"))
		}
		if tc.ctype == "application/json" {
			var e api.Error
			if err := json.Unmarshal(body, &e); err != nil || e.Code == "" || e.RequestID == "" {
				t.Errorf("%s: want an api.Error, got %s", name, body)
			}
		}
	}
}

// TestListOwner: a key lists its own sandboxes; ?owner= is for admin keys
// only, * listing every key's and a key id that key's.
func TestListOwner(t *testing.T) {
	h := newHarness(t, false, harnessOpts{})
	ctx := context.Background()
	keys := map[string]string{} // name -> secret
	ids := map[string]string{}  // name -> key id
	for _, name := range []string{"root", "ann", "bob"} {
		k, secret := apikey.New(name, name == "root")
		if err := h.store.CreateKey(ctx, k); err != nil {
			t.Fatal(err)
		}
		keys[name], ids[name] = secret, k.ID
	}
	start := time.Now().Add(-time.Minute)
	for i, owner := range []string{"ann", "bob", "bob"} {
		sb := sandbox.Sandbox{ID: sandbox.ID("owner" + strings.Repeat(string(rune('a'+i)), 8)), Template: "base", Runtime: "runc",
			State: sandbox.StatePaused, Owner: ids[owner], CreatedAt: start.Add(time.Duration(i) * time.Second),
			Env: map[string]string{"TOKEN": "secret of " + owner}} // paused: a record that keeps its env
		if err := h.store.PutSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		key, query string
		status     int
		owners     []string // of the listed sandboxes, in order
	}{
		{"ann", "", http.StatusOK, []string{"ann"}},
		{"bob", "", http.StatusOK, []string{"bob", "bob"}},
		{"ann", "?owner=*", http.StatusForbidden, nil},
		{"ann", "?owner=" + ids["bob"], http.StatusForbidden, nil},
		{"root", "", http.StatusOK, nil},
		{"root", "?owner=*", http.StatusOK, []string{"ann", "bob", "bob"}},
		{"root", "?owner=" + ids["bob"], http.StatusOK, []string{"bob", "bob"}},
		{"root", "?owner=key_nobody", http.StatusOK, nil},
		{"root", "?owner=", http.StatusBadRequest, nil},
		{"root", "?owner=*&owner=*", http.StatusBadRequest, nil},
	} {
		var l api.SandboxList
		h.do("GET", "/v1/sandboxes"+tc.query, keys[tc.key], nil, tc.status, &l)
		if tc.status != http.StatusOK {
			continue
		}
		var got []string
		for _, sb := range l.Sandboxes {
			if own := sb.Owner == ids[tc.key]; own != (sb.Env["TOKEN"] != "") {
				t.Errorf("%s %q: sandbox %s of %s listed with env %v: want it for the key's own only", tc.key, tc.query, sb.ID, sb.Owner, sb.Env)
			}
			for name, id := range ids {
				if sb.Owner == id {
					got = append(got, name)
				}
			}
		}
		if !slices.Equal(got, tc.owners) || len(got) != len(l.Sandboxes) {
			t.Errorf("%s %q: owners %v (%d sandboxes), want %v", tc.key, tc.query, got, len(l.Sandboxes), tc.owners)
		}
	}
}

// TestNodeInfo: an admin key reads the node's runtimes and capacity (read
// from the host: non-zero); other keys get 403.
func TestNodeInfo(t *testing.T) {
	h := newHarness(t, false, harnessOpts{})
	var n api.NodeInfo
	h.do("GET", "/v1/node", h.admin, nil, http.StatusOK, &n)
	if n.Version != "test" || n.Role != "all" || n.Name != "" || !slices.Equal(n.Runtimes, []string{"runsc", "runc"}) || n.DefaultRuntime == "" {
		t.Errorf("node: %+v", n)
	}
	if n.CPUs < 1 || n.MemoryBytes <= 0 || n.MemoryAvailableBytes <= 0 || n.MemoryAvailableBytes > n.MemoryBytes ||
		n.DiskBytes <= 0 || n.DiskFreeBytes < 0 || n.DiskFreeBytes > n.DiskBytes || n.Sandboxes == nil {
		t.Errorf("capacity: %+v", n)
	}
	h.do("GET", "/v1/node", h.a, nil, http.StatusForbidden, nil)
	h.do("GET", "/v1/node", "", nil, http.StatusUnauthorized, nil)
}

// TestClusterNodes: an admin key lists the catalog's nodes (none outside
// a cluster) with their capacity and load; other keys get 403.
func TestClusterNodes(t *testing.T) {
	h := newHarness(t, false, harnessOpts{})
	var l api.ClusterNodeList
	h.do("GET", "/v1/nodes", h.admin, nil, http.StatusOK, &l)
	if l.Nodes == nil || len(l.Nodes) != 0 {
		t.Errorf("nodes outside a cluster: %+v, want an empty list", l)
	}
	if _, err := h.store.Heartbeat(context.Background(), cluster.Node{Name: "node-1", URL: "http://10.0.0.1:8421",
		CPUs: 4, MemoryBytes: 8 << 30, Slots: 10, Runtimes: []string{"runc"}, StartedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	h.do("GET", "/v1/nodes", h.admin, nil, http.StatusOK, &l)
	if len(l.Nodes) != 1 || l.Nodes[0].Name != "node-1" || l.Nodes[0].State != "live" || l.Nodes[0].Slots != 10 ||
		l.Nodes[0].HeartbeatAt.IsZero() || !slices.Equal(l.Nodes[0].Runtimes, []string{"runc"}) {
		t.Errorf("nodes: %+v", l)
	}
	h.do("GET", "/v1/nodes", h.a, nil, http.StatusForbidden, nil)
	h.do("GET", "/v1/nodes", "", nil, http.StatusUnauthorized, nil)
}
