package cluster_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/oci/ocitest"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/template"
	"github.com/kiln-sh/kiln/internal/tools"
)

// TestMCPThroughFronts drives MCP's streamable HTTP transport (/mcp) with
// the Go SDK's MCP client through two fronts, every request to the other
// front than the last: the session lives on the node that made it (its
// id names it), and its sandboxes are placed across the cluster as any
// create, so the session reaches a sandbox on the other node too. And
// GET /v1/node through a front answers for the front.
func TestMCPThroughFronts(t *testing.T) {
	began := time.Now()
	w := newWorld(t)
	_, err := template.Lookup(config.FromEnv().DataDir, "code-interpreter")
	ocitest.Require(t, err == nil, fmt.Sprintf("code-interpreter template not built (make setup): %v", err))
	front1 := w.firstFront("front-1")
	front2 := w.start("front-2", config.RoleFront, "")
	nodes := []*proc{w.start("node-a", config.RoleNode, ""), w.start("node-b", config.RoleNode, "")}
	for _, p := range append([]*proc{front2}, nodes...) {
		w.ready(p)
	}
	w.waitLive("node-a", "node-b")
	t.Logf("cluster up at %v", time.Since(began).Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	alt := &alternate{fronts: []string{front1.URL, front2.URL}, key: w.key}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: front1.URL + "/mcp", HTTPClient: &http.Client{Transport: alt}, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	home, ok := tools.SessionNode(cs.ID())
	if !ok {
		t.Fatalf("session id %q names no node", cs.ID())
	}
	t.Logf("session %s lives on %s", cs.ID(), home)

	call := func(name string, args map[string]any) string {
		t.Helper()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var b strings.Builder
		for _, c := range res.Content {
			if tc, ok := c.(*mcp.TextContent); ok {
				b.WriteString(tc.Text)
			}
		}
		if res.IsError {
			t.Fatalf("%s: tool error: %s", name, b.String())
		}
		return b.String()
	}
	started := regexp.MustCompile(`Started sandbox ([a-z0-9]+)`)
	// Two sandboxes one after the other: the second is placed while the
	// first still runs, so on the other node (the less loaded), and one
	// of them is on another node than the session.
	var placed []string
	for i := range 2 {
		m := started.FindStringSubmatch(call("create_sandbox", map[string]any{}))
		if m == nil {
			t.Fatalf("create_sandbox %d answered no sandbox id", i)
		}
		placed = append(placed, w.nodeOf(m[1]))
		call("execute_python", map[string]any{"code": fmt.Sprintf("x = %d * 7", 6+i)})
		if got := call("execute_python", map[string]any{"code": "print(x)"}); !strings.Contains(got, fmt.Sprint((6+i)*7)) {
			t.Errorf("sandbox %d on %s: print(x) = %q, want %d", i, placed[i], got, (6+i)*7)
		}
		if got := call("run_command", map[string]any{"command": "hostname"}); !strings.Contains(got, m[1]) {
			t.Errorf("sandbox %d: hostname = %q, want its id %s", i, got, m[1])
		}
	}
	t.Logf("the session's sandboxes ran on %v; %d requests went through each front", placed, alt.n.Load()/2)
	if placed[0] == placed[1] || (placed[0] != home && placed[1] != home) {
		t.Errorf("sandboxes on %v, session on %s: want one on each node", placed, home)
	}
	if alt.n.Load() < 10 {
		t.Errorf("only %d MCP requests went through the fronts", alt.n.Load())
	}

	// A session id that names no live node is an unknown session.
	for _, id := range []string{"0123456789abcdef0123456789abcdef.node-z", "not-a-session"} {
		req, _ := http.NewRequestWithContext(ctx, "POST", front2.URL+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":9,"method":"tools/list"}`))
		req.Header.Set("Authorization", "Bearer "+w.key)
		req.Header.Set("Mcp-Session-Id", id)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("session id %q through a front: %d, want 404", id, resp.StatusCode)
		}
	}

	// GET /v1/node through a front answers for the front itself.
	req, _ := http.NewRequestWithContext(ctx, "GET", front2.URL+"/v1/node", nil)
	req.Header.Set("Authorization", "Bearer "+w.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var info api.NodeInfo
	err = json.NewDecoder(resp.Body).Decode(&info)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || info.Role != config.RoleFront || len(info.Runtimes) != 0 || info.CPUs == 0 {
		t.Errorf("GET /v1/node through a front: %d %+v, %v; want the front's own (role front, no runtimes)", resp.StatusCode, info, err)
	}

	// Ending the session (DELETE through a front) kills its sandbox,
	// whichever node runs it.
	last := started.FindStringSubmatch(call("create_sandbox", map[string]any{}))[1]
	if err := cs.Close(); err != nil {
		t.Errorf("closing the session: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		sb, err := w.catalog.GetSandbox(ctx, sandbox.ID(last))
		if err == nil && sb.State.Terminal() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the ended session's sandbox %s: %+v, %v; want it ended", last, sb.State, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// alternate sends each request to the next of fronts in turn, with the
// API key.
type alternate struct {
	fronts []string
	key    string
	n      atomic.Int64
}

func (a *alternate) RoundTrip(r *http.Request) (*http.Response, error) {
	u, err := url.Parse(a.fronts[int(a.n.Add(1))%len(a.fronts)])
	if err != nil {
		return nil, err
	}
	r = r.Clone(r.Context())
	r.URL.Scheme, r.URL.Host, r.Host = u.Scheme, u.Host, ""
	r.Header.Set("Authorization", "Bearer "+a.key)
	return http.DefaultTransport.RoundTrip(r)
}
