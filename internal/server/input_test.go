package server_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/server"
)

// TestBadInput sends malformed, hostile and absurd requests: each gets a
// 4xx api.Error with a message that says what is wrong, never a 500.
func TestBadInput(t *testing.T) {
	h := newHarness(t, false, harnessOpts{})
	const sb = "/v1/sandboxes/abcdefgh12345678"
	big := `{"metadata":{"k":"` + strings.Repeat("x", 2<<20) + `"}}`
	wellFormedUnknown := "e2b_" + strings.Repeat("0", 40)
	cases := []struct {
		name, method, path, body string
		key                      string // "" = key A; "-" = none
		hdr                      []string
		status                   int
		msg                      string // substring of the message
		needsTemplate            bool
	}{
		{name: "no key", method: "GET", path: "/v1/sandboxes", key: "-", status: 401, msg: "missing API key"},
		{name: "malformed key", method: "GET", path: "/v1/sandboxes", key: "sk-123", status: 401, msg: "malformed"},
		{name: "unknown key", method: "GET", path: "/v1/sandboxes", key: wellFormedUnknown, status: 401, msg: "unknown or revoked"},
		{name: "basic auth", method: "GET", path: "/v1/sandboxes", key: "-", hdr: []string{"Authorization", "Basic eDp5"}, status: 401, msg: "Bearer"},
		{name: "metrics need a key", method: "GET", path: "/metrics", key: "-", status: 401},
		{name: "keys need admin", method: "GET", path: "/v1/keys", status: 403, msg: "admin"},
		{name: "no route", method: "GET", path: "/v2/nothing", status: 404, msg: "no route"},
		{name: "wrong method", method: "PATCH", path: "/v1/sandboxes", status: 405, msg: "not allowed"},

		{name: "malformed JSON", method: "POST", path: "/v1/sandboxes", body: `{"template":`, status: 400, msg: "malformed JSON"},
		{name: "empty body", method: "POST", path: "/v1/sandboxes", body: ``, status: 400, msg: "empty request body"},
		{name: "unknown field", method: "POST", path: "/v1/sandboxes", body: `{"tempalte":"base"}`, status: 400, msg: "tempalte"},
		{name: "wrong type", method: "POST", path: "/v1/sandboxes", body: `{"timeout":"5m"}`, status: 400, msg: "timeout"},
		{name: "trailing data", method: "POST", path: "/v1/sandboxes", body: `{}{}`, status: 400, msg: "after the JSON"},
		{name: "oversized body", method: "POST", path: "/v1/sandboxes", body: big, status: 400, msg: "larger than"},
		{name: "form body", method: "POST", path: "/v1/sandboxes", body: `a=b`, hdr: []string{"Content-Type", "application/x-www-form-urlencoded"}, status: 400, msg: "malformed JSON"},
		{name: "negative timeout", method: "POST", path: "/v1/sandboxes", body: `{"timeout":-1}`, status: 400, msg: "timeout"},
		{name: "huge timeout", method: "POST", path: "/v1/sandboxes", body: `{"timeout":9223372036854775807}`, status: 400, msg: "timeout"},
		{name: "negative limits", method: "POST", path: "/v1/sandboxes", body: `{"limits":{"memory_bytes":-1}}`, status: 400, msg: "negative"},
		{name: "absurd memory", method: "POST", path: "/v1/sandboxes", body: `{"limits":{"memory_bytes":1000000000000000}}`, status: 400, msg: "memory", needsTemplate: true},
		{name: "absurd cpus", method: "POST", path: "/v1/sandboxes", body: `{"limits":{"cpus":1e9}}`, status: 400, msg: "cpus", needsTemplate: true},
		{name: "bad template", method: "POST", path: "/v1/sandboxes", body: `{"template":"../../etc"}`, status: 400, msg: "template"},
		{name: "reserved env", method: "POST", path: "/v1/sandboxes", body: `{"env":{"KILN_X":"1"}}`, status: 400, msg: "KILN_", needsTemplate: true},

		{name: "bad id", method: "GET", path: "/v1/sandboxes/NOT_AN_ID!", status: 400, msg: "sandbox id"},
		{name: "short id", method: "GET", path: "/v1/sandboxes/abc", status: 400, msg: "sandbox id"},
		{name: "unknown id", method: "GET", path: sb, status: 404, msg: "not found"},
		{name: "unknown id kill", method: "DELETE", path: sb, status: 404},
		{name: "bad state filter", method: "GET", path: "/v1/sandboxes?state=dancing", status: 400, msg: "state"},
		{name: "zero page size", method: "GET", path: "/v1/sandboxes?limit=0", status: 400, msg: "limit"},
		{name: "huge page size", method: "GET", path: "/v1/sandboxes?limit=100000", status: 400, msg: "limit"},
		{name: "bad page token", method: "GET", path: "/v1/sandboxes?page_token=%21%21", status: 400, msg: "page token"},
		{name: "unknown query", method: "GET", path: "/v1/sandboxes?sate=running", status: 400, msg: "sate"},
		{name: "zero timeout", method: "POST", path: sb + "/timeout", body: `{"timeout":0}`, status: 400, msg: "timeout"},

		{name: "args and cmd", method: "POST", path: sb + "/commands", body: `{"cmd":"ls","args":["ls"]}`, status: 400, msg: "exactly one"},
		{name: "no command", method: "POST", path: sb + "/commands", body: `{}`, status: 400, msg: "exactly one"},
		{name: "websocket on POST", method: "POST", path: sb + "/commands", body: `{"cmd":"touch /tmp/should-not-run"}`, hdr: []string{"Upgrade", "websocket"}, status: 400, msg: "background:true"},
		{name: "bad user", method: "POST", path: sb + "/commands", body: `{"cmd":"id","user":"admin"}`, status: 400, msg: "user"},
		{name: "negative command timeout", method: "POST", path: sb + "/commands", body: `{"cmd":"id","timeout":-5}`, status: 400, msg: "timeout"},
		{name: "huge command timeout", method: "POST", path: sb + "/commands", body: `{"cmd":"id","timeout":1e300}`, status: 400, msg: "timeout"},
		{name: "huge output limit", method: "POST", path: sb + "/commands", body: `{"cmd":"id","output_limit":1099511627776}`, status: 400, msg: "output_limit"},
		{name: "NUL in args", method: "POST", path: sb + "/commands", body: `{"args":["a\u0000b"]}`, status: 400, msg: "NUL"},
		{name: "zero pty", method: "POST", path: sb + "/commands", body: `{"cmd":"sh","pty":{"cols":0,"rows":0}}`, status: 400, msg: "pty"},
		{name: "pid zero", method: "GET", path: sb + "/commands/0/events", status: 400, msg: "pid"},
		{name: "pid negative", method: "POST", path: sb + "/commands/-3/signal", body: `{"signal":"TERM"}`, status: 400, msg: "pid"},
		{name: "pid text", method: "POST", path: sb + "/commands/abc/stdin", status: 400, msg: "pid"},
		{name: "bad after_seq", method: "GET", path: sb + "/commands/5/events?after_seq=-1", status: 400, msg: "after_seq"},
		{name: "bad signal", method: "POST", path: sb + "/commands/5/signal", body: `{"signal":"SIGNUKE"}`, status: 400, msg: "signal"},
		{name: "bad resize", method: "POST", path: sb + "/commands/5/resize", body: `{"cols":0,"rows":10}`, status: 400, msg: "size"},

		{name: "missing path", method: "GET", path: sb + "/files", status: 400, msg: "path is required"},
		{name: "NUL path", method: "GET", path: sb + "/files/stat?path=a%00b", status: 400, msg: "NUL"},
		{name: "long path", method: "GET", path: sb + "/files/stat?path=" + strings.Repeat("a", 5000), status: 400, msg: "longer"},
		{name: "bad file user", method: "GET", path: sb + "/files/list?path=/&user=nobody", status: 400, msg: "user"},
		{name: "bad depth", method: "GET", path: sb + "/files/list?path=/&depth=1000", status: 400, msg: "depth"},
		{name: "bad mode", method: "PUT", path: sb + "/files?path=x&mode=999", status: 400, msg: "mode"},
		{name: "bad recursive", method: "GET", path: sb + "/files/watch?path=/&recursive=maybe", status: 400, msg: "recursive"},
		{name: "empty mkdir", method: "POST", path: sb + "/files/mkdir", body: `{"path":""}`, status: 400, msg: "path"},
		{name: "empty move", method: "POST", path: sb + "/files/move", body: `{"from":"a"}`, status: 400, msg: "to"},
		{name: "upload not multipart", method: "POST", path: sb + "/files?dir=/tmp", body: "x", status: 404},

		{name: "key without name", method: "POST", path: "/v1/keys", key: "admin", body: `{"name":""}`, status: 400, msg: "name"},
		{name: "negative key quota", method: "POST", path: "/v1/keys", key: "admin", body: `{"name":"x","max_sandboxes":-1}`, status: 400, msg: "quota"},
		{name: "bad key id", method: "DELETE", path: "/v1/keys/..%2f..", key: "admin", status: 400, msg: "key id"},
		{name: "unknown key id", method: "DELETE", path: "/v1/keys/key_abcdef", key: "admin", status: 404},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.needsTemplate && !h.sandbox {
				t.Skip("needs root and the base template to reach the manager's validation")
			}
			key := h.a
			switch c.key {
			case "-":
				key = ""
			case "admin":
				key = h.admin
			case "":
			default:
				key = c.key
			}
			req, _ := http.NewRequest(c.method, h.ts.URL+c.path, strings.NewReader(c.body))
			if key != "" {
				req.Header.Set("Authorization", "Bearer "+key)
			}
			for i := 0; i+1 < len(c.hdr); i += 2 {
				req.Header.Set(c.hdr[i], c.hdr[i+1])
			}
			resp, err := h.ts.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			e := apiErr(t, resp)
			if resp.StatusCode != c.status || !strings.Contains(e.Message, c.msg) {
				t.Errorf("%s %s: %d %+v, want %d with %q", c.method, c.path, resp.StatusCode, e, c.status, c.msg)
			}
			if strings.Contains(e.Message, "/var/lib/kiln") || strings.Contains(e.Message, "kiln.db") {
				t.Errorf("message leaks a host path: %q", e.Message)
			}
		})
	}
}

// TestRoutes checks the route table has every route of the contract once.
func TestRoutes(t *testing.T) {
	routes := server.Routes()
	for _, want := range []string{
		"GET /healthz", "GET /metrics", "POST /v1/sandboxes", "GET /v1/sandboxes", "GET /v1/sandboxes/{id}",
		"DELETE /v1/sandboxes/{id}", "POST /v1/sandboxes/{id}/timeout", "GET /v1/sandboxes/{id}/usage",
		"POST /v1/sandboxes/{id}/pause", "POST /v1/sandboxes/{id}/resume",
		"POST /v1/sandboxes/{id}/fork",
		"POST /v1/sandboxes/{id}/snapshots", "GET /v1/snapshots", "GET /v1/snapshots/{name}", "DELETE /v1/snapshots/{name}",
		"GET /v1/sandboxes/{id}/network",
		"PUT /v1/sandboxes/{id}/network",
		"GET /v1/sandboxes/{id}/network/usage",
		"POST /v1/sandboxes/{id}/commands", "GET /v1/sandboxes/{id}/commands",
		"GET /v1/sandboxes/{id}/commands/{pid}/events", "POST /v1/sandboxes/{id}/commands/{pid}/stdin",
		"POST /v1/sandboxes/{id}/commands/{pid}/signal", "POST /v1/sandboxes/{id}/commands/{pid}/resize",
		"POST /v1/sandboxes/{id}/code", "POST /v1/sandboxes/{id}/contexts", "GET /v1/sandboxes/{id}/contexts",
		"POST /v1/sandboxes/{id}/contexts/{ctx}/restart", "DELETE /v1/sandboxes/{id}/contexts/{ctx}",
		"GET /v1/sandboxes/{id}/files", "PUT /v1/sandboxes/{id}/files", "POST /v1/sandboxes/{id}/files",
		"DELETE /v1/sandboxes/{id}/files", "GET /v1/sandboxes/{id}/files/list", "GET /v1/sandboxes/{id}/files/stat",
		"POST /v1/sandboxes/{id}/files/mkdir", "POST /v1/sandboxes/{id}/files/move", "GET /v1/sandboxes/{id}/files/watch",
		"GET /v1/sandboxes/{id}/screenshot",
		"GET /v1/keys", "POST /v1/keys", "DELETE /v1/keys/{id}",
		"GET /v1/tools", "POST /v1/sandboxes/{id}/tools/{name}", "POST /mcp", "GET /mcp", "DELETE /mcp",
		"HEAD /v1/templates/files/{hash}", "PUT /v1/templates/files/{hash}", "POST /v1/templates/builds",
		"GET /v1/templates/builds", "GET /v1/templates/builds/{id}", "GET /v1/templates/builds/{id}/logs",
		"GET /v1/templates", "GET /v1/templates/{ref}", "DELETE /v1/templates/{ref}", "POST /v1/templates/{ref}/push", "PATCH /v1/templates/{name}",
		"PUT /v1/templates/{name}/tags/{tag}", "DELETE /v1/templates/{name}/tags/{tag}",
		"POST /v1/volumes", "GET /v1/volumes", "GET /v1/volumes/{id}", "DELETE /v1/volumes/{id}",
		"GET /v1/node", "GET /v1/nodes",
	} {
		if !slices.Contains(routes, want) {
			t.Errorf("route %q missing", want)
		}
	}
	if len(routes) != 66 {
		t.Errorf("%d routes: %q", len(routes), routes)
	}
}

// TestHealthMetricsKeys covers the routes that need no sandbox.
func TestHealthMetricsKeys(t *testing.T) {
	h := newHarness(t, false, harnessOpts{})
	var hl api.Health
	h.do("GET", "/healthz", "", nil, 200, &hl)
	if hl.Status != "ok" || hl.Version != "test" {
		t.Errorf("health %+v", hl)
	}
	resp := h.request("GET", "/metrics", h.a, nil)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"kiln_sandboxes{state=\"running\"}", "kiln_http_request_duration_seconds_bucket", "go_goroutines", "process_open_fds"} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("metrics lack %s", want)
		}
	}

	var k api.APIKey
	h.do("POST", "/v1/keys", h.admin, api.CreateKeyRequest{Name: "ci", MaxSandboxes: 3}, 201, &k)
	if !strings.HasPrefix(k.Secret, "e2b_") || k.Prefix != k.Secret[:12] || k.MaxSandboxes != 3 {
		t.Fatalf("created %+v", k)
	}
	var list api.SandboxList
	h.do("GET", "/v1/sandboxes", k.Secret, nil, 200, &list) // the new key works, as X-API-Key too
	resp = h.request("GET", "/v1/sandboxes", "", nil, "X-API-Key", k.Secret)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("X-API-Key: %d", resp.StatusCode)
	}
	h.do("DELETE", "/v1/keys/"+k.ID, h.admin, nil, 204, nil)
	// Revoked through this server: refused at once, cache or not.
	if e := apiErr(t, h.request("GET", "/v1/sandboxes", k.Secret, nil)); e.Code != api.CodeUnauthenticated {
		t.Errorf("revoked key: %+v", e)
	}
}

// TestShutdownDrains checks that Shutdown cancels a stream that outlives
// the grace period, with a final error event.
func TestShutdownDrains(t *testing.T) {
	h := newHarness(t, true, harnessOpts{})
	sb := h.create(h.a, api.CreateSandboxRequest{})
	resp := h.request("POST", "/v1/sandboxes/"+sb.ID+"/commands", h.a, strings.NewReader(`{"cmd":"echo up; sleep 30"}`))
	defer resp.Body.Close()
	var last api.Event
	shut := make(chan error, 1)
	start := time.Now()
	readEvents(t, resp.Body, func(ev api.Event) bool {
		if ev.Type == api.EventStdout {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
				defer cancel()
				shut <- h.srv.Shutdown(ctx)
			}()
		}
		last = ev
		return true
	})
	if err := <-shut; err == nil {
		t.Errorf("Shutdown: nil, want the grace period's deadline error")
	}
	if last.Type != api.EventError || last.Error.Code != api.CodeUnavailable || time.Since(start) > 10*time.Second {
		t.Errorf("stream ended with %+v after %v, want an unavailable error event soon", last, time.Since(start))
	}
}
