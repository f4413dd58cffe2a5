package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/client"
	"github.com/kiln-sh/kiln/internal/tools"
)

// TestToolDefinitions checks GET /v1/tools in each format and its input
// errors.
func TestToolDefinitions(t *testing.T) {
	h := newHarness(t, false, harnessOpts{})
	for _, tc := range []struct {
		query string
		names []string // of the tools answered, in order
		name  func(map[string]any) any
	}{
		{"", []string{"execute_python", "run_code", "run_command", "read_file", "write_file", "list_files"},
			func(d map[string]any) any { return d["function"].(map[string]any)["name"] }},
		{"?format=anthropic&names=run_command,execute_python", []string{"execute_python", "run_command"},
			func(d map[string]any) any { return d["name"] }},
		{"?format=mcp&names=read_file", []string{"read_file"},
			func(d map[string]any) any { return d["name"] }},
	} {
		var defs []map[string]any
		h.do("GET", "/v1/tools"+tc.query, h.a, nil, 200, &defs)
		var got []string
		for _, d := range defs {
			got = append(got, tc.name(d).(string))
		}
		if strings.Join(got, ",") != strings.Join(tc.names, ",") {
			t.Errorf("GET /v1/tools%s: %v, want %v", tc.query, got, tc.names)
		}
	}
	var defs []map[string]any
	h.do("GET", "/v1/tools?format=anthropic&names=run_code", h.a, nil, 200, &defs)
	schema, _ := json.Marshal(defs[0]["input_schema"])
	if !strings.Contains(string(schema), `"required":["code"]`) || !strings.Contains(string(schema), `"enum":["python","r"`) {
		t.Errorf("run_code schema: %s", schema)
	}
	for _, q := range []string{"?format=gemini", "?names=rm_rf", "?names=create_sandbox", "?fromat=openai"} {
		h.do("GET", "/v1/tools"+q, h.a, nil, 400, nil)
	}
	h.do("GET", "/v1/tools", "", nil, 401, nil)
}

// TestCallTool runs model tool calls through POST
// /v1/sandboxes/{id}/tools/{name} in a real sandbox: results and failures
// both come back as 200 ToolResults; only an unusable sandbox or an unknown
// tool is an HTTP error.
func TestCallTool(t *testing.T) {
	h := newHarness(t, true, harnessOpts{})
	sb := h.create(h.a, api.CreateSandboxRequest{})
	defer h.do("DELETE", "/v1/sandboxes/"+sb.ID, h.a, nil, 204, nil)
	path := "/v1/sandboxes/" + sb.ID + "/tools/"
	for _, tc := range []struct {
		tool, args string
		isError    bool
		text       string // in the first content item
	}{
		{"run_command", `{"command":"echo hi; echo oops >&2"}`, false, "exit code 0\nstdout:\nhi\nstderr:\noops\n"},
		{"run_command", `{"command":"exit 7"}`, true, "exit code 7"},
		{"write_file", `{"path":"d/x.txt","content":"strawberry"}`, false, "wrote 10 bytes to /home/user/d/x.txt"},
		{"read_file", `{"path":"d/x.txt"}`, false, "strawberry"},
		{"list_files", `{"path":"d"}`, false, "/home/user/d/x.txt"},
		{"list_files", `{}`, false, "/home/user/d/"},
		{"read_file", `{"path":"d/missing"}`, true, "not_found"},
		{"read_file", `{"path":"/etc/shadow"}`, true, "permission_denied"},
		{"run_command", `{"cmd":"ls"}`, true, `unknown field "cmd"`},
		{"run_command", `{"command":""}`, true, "command is required"},
		{"run_command", `{"command":5}`, true, "command must be a string, not number"},
		{"write_file", `{"path":"y"}`, true, "content is required"},
		{"run_command", `{"command":"sleep 5","timeout":0.5}`, true, "timeout"},
	} {
		var res api.ToolResult
		h.do("POST", path+tc.tool, h.a, json.RawMessage(tc.args), 200, &res)
		if len(res.Content) == 0 || res.IsError != tc.isError || !strings.Contains(res.Content[0].Text, tc.text) {
			t.Errorf("%s %s: %+v, want is_error %v and %q", tc.tool, tc.args, res, tc.isError, tc.text)
		}
	}
	h.do("POST", path+"create_sandbox", h.a, json.RawMessage(`{}`), 404, nil)
	h.do("POST", path+"rm_rf", h.a, json.RawMessage(`{}`), 404, nil)
	h.do("POST", path+"run_command", h.b, json.RawMessage(`{"command":"id"}`), 404, nil) // another key's sandbox
	h.do("POST", path+"run_command", h.a, json.RawMessage(` [1]`), 400, nil)
}

// TestMCPSessionLifecycle checks the sandbox of an MCP session over HTTP:
// an idle session ends and takes its sandbox with it; a sandbox killed
// from outside is reported lost, then replaced; create_sandbox and
// kill_sandbox replace it; Close (a server shutdown) ends the rest.
func TestMCPSessionLifecycle(t *testing.T) {
	h := newHarness(t, true, harnessOpts{})
	c := client.New(h.ts.URL, h.a)
	hh := tools.NewHTTPHandler(func(*http.Request) *client.Client { return c }, tools.HTTPOptions{
		IdleTimeout: 2 * time.Second, Session: tools.Options{Template: "base"},
	})
	ts := httptest.NewServer(hh)
	defer ts.Close()
	ctx := context.Background()
	hostname := func(cs *mcp.ClientSession) string {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_command", Arguments: map[string]any{"command": "hostname"}})
		if err != nil || res.IsError {
			t.Fatalf("hostname: %+v, %v", res, err)
		}
		return strings.TrimSpace(strings.TrimPrefix(res.Content[0].(*mcp.TextContent).Text, "exit code 0\nstdout:\n"))
	}
	open := func() (*mcp.ClientSession, string) {
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).
			Connect(ctx, &mcp.StreamableClientTransport{Endpoint: ts.URL, MaxRetries: -1}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return cs, hostname(cs)
	}
	gone := func(id string) bool {
		sb, err := c.GetSandbox(ctx, id)
		return client.IsCode(err, api.CodeNotFound) || (err == nil && sb.State == "stopped")
	}

	idle, idleID := open()
	defer idle.Close()
	for deadline := time.Now().Add(30 * time.Second); !gone(idleID); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the idle session's sandbox %s is still there", idleID)
		}
	}
	if _, err := idle.CallTool(ctx, &mcp.CallToolParams{Name: "list_files", Arguments: map[string]any{}}); err == nil {
		t.Error("a call on the expired session worked")
	}

	// A sandbox killed behind the session's back: the next call says its
	// state is lost, the one after gets a new sandbox.
	live, killedID := open()
	if err := c.KillSandbox(ctx, killedID); err != nil {
		t.Fatal(err)
	}
	res, err := live.CallTool(ctx, &mcp.CallToolParams{Name: "execute_python", Arguments: map[string]any{"code": "x"}})
	if err != nil || !res.IsError || !strings.Contains(res.Content[len(res.Content)-1].(*mcp.TextContent).Text, "state is lost") {
		t.Fatalf("call after the sandbox was killed: %+v, %v", res, err)
	}
	liveID := hostname(live)
	if liveID == killedID || gone(liveID) {
		t.Fatalf("sandbox after the lost one: %s", liveID)
	}

	// create_sandbox replaces the sandbox, but only once the new one
	// runs; kill_sandbox kills it and the next call starts another.
	call := func(name string, args map[string]any) *mcp.CallToolResult {
		res, err := live.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return res
	}
	if res := call("create_sandbox", map[string]any{"template": "no-such-template"}); !res.IsError || hostname(live) != liveID {
		t.Errorf("create_sandbox of a missing template: %+v", res.Content[0])
	}
	if res := call("create_sandbox", map[string]any{}); res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "previous sandbox was killed") {
		t.Errorf("create_sandbox: %+v", res.Content[0])
	}
	if newID := hostname(live); newID == liveID || !gone(liveID) {
		t.Errorf("after create_sandbox: %s, the old %s gone: %v", newID, liveID, gone(liveID))
	} else {
		liveID = newID
	}
	if res := call("kill_sandbox", nil); res.IsError || !gone(liveID) {
		t.Errorf("kill_sandbox: %+v, gone %v", res.Content[0], gone(liveID))
	}
	liveID = hostname(live)
	if hh.Sessions() != 1 || gone(liveID) {
		t.Fatalf("%d sessions, sandbox %s gone: %v", hh.Sessions(), liveID, gone(liveID))
	}
	hh.Close()
	if !gone(liveID) || hh.Sessions() != 0 {
		t.Errorf("after Close: %d sessions, sandbox %s gone: %v", hh.Sessions(), liveID, gone(liveID))
	}
}

// TestMCPProgress checks that /mcp streams a call's output as progress
// notifications when the client asks for them (a progress token), through
// the in-process client's streaming body.
func TestMCPProgress(t *testing.T) {
	h := newHarness(t, true, harnessOpts{})
	ctx := context.Background()
	var mu sync.Mutex
	var msgs []string
	cl := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			mu.Lock()
			msgs = append(msgs, req.Params.Message)
			mu.Unlock()
		},
	})
	hc := &http.Client{Transport: bearerTransport(h.a)}
	cs, err := cl.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: h.ts.URL + "/mcp", HTTPClient: hc, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	params := &mcp.CallToolParams{Name: "run_command", Arguments: map[string]any{"command": "for i in 1 2 3; do echo line$i; sleep 0.5; done"}}
	params.SetProgressToken("p1")
	res, err := cs.CallTool(ctx, params)
	if err != nil || res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "line1\nline2\nline3") {
		t.Fatalf("call: %+v, %v", res, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(msgs) < 2 || !strings.HasPrefix(msgs[0], "line") || !slices.Contains(msgs, "line3") {
		t.Errorf("progress messages %q, want line1 .. line3", msgs)
	}
}

type bearerTransport string

func (k bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+string(k))
	return http.DefaultTransport.RoundTrip(r)
}
