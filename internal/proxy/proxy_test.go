package proxy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/apikey"
	"github.com/kiln-sh/kiln/internal/e2b"
	"github.com/kiln-sh/kiln/internal/metrics"
	"github.com/kiln-sh/kiln/internal/network/nettest"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/sandbox/sandboxtest"
	"github.com/kiln-sh/kiln/internal/server"
)

var agentPath string

func TestMain(m *testing.M) { os.Exit(sandboxtest.Main(m, &agentPath)) }

// echoServer is an HTTP server for a sandbox (port [bind address]): GET
// /host answers the request's Host header, other GETs "hello from
// <path>", and a WebSocket upgrade on any path echoes every message.
// Python's standard library only (the base template has no websockets).
const echoServer = `
import base64, hashlib, http.server, struct, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_GET(self):
        if self.headers.get("Upgrade", "").lower() != "websocket":
            body = (self.headers.get("Host", "") if self.path == "/host" else "hello from " + self.path).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        key = self.headers["Sec-WebSocket-Key"] + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", base64.b64encode(hashlib.sha1(key.encode()).digest()).decode())
        self.end_headers()
        self.wfile.flush()
        r = self.rfile
        while True:
            h = r.read(2)
            if len(h) < 2:
                return
            op, n = h[0] & 15, h[1] & 127
            if n == 126:
                n = struct.unpack(">H", r.read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", r.read(8))[0]
            mask = r.read(4) if h[1] & 128 else bytes(4)
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(r.read(n)))
            if op == 8:
                self.wfile.write(b"\x88\x00")
                self.wfile.flush()
                return
            if op == 9:
                op = 10
            hdr = bytes([128 | op])
            if len(data) < 126:
                hdr += bytes([len(data)])
            elif len(data) < 65536:
                hdr += bytes([126]) + struct.pack(">H", len(data))
            else:
                hdr += bytes([127]) + struct.pack(">Q", len(data))
            self.wfile.write(hdr + data)
            self.wfile.flush()
http.server.ThreadingHTTPServer((sys.argv[2] if len(sys.argv) > 2 else "0.0.0.0", int(sys.argv[1])), H).serve_forever()
`

type env struct {
	t          testing.TB
	m          *sandbox.Manager
	url        string // the API server
	owner      string // API key secrets
	other      string
	ownerKeyID string
}

// newEnv runs a real API server (with the E2B router and this proxy wired
// as in kiln serve) over a Manager whose sandboxes get networks in a test
// world.
func newEnv(t testing.TB) *env {
	t.Helper()
	_, n := nettest.Standard(t)
	cfg := sandboxtest.Config(t, agentPath)
	cfg.Net = n
	m := sandboxtest.NewManager(t, cfg)
	st := cfg.Store.(apikey.Store)
	e := &env{t: t, m: m}
	for _, k := range []*string{&e.owner, &e.other} {
		key, secret := apikey.New("k", false)
		if err := st.CreateKey(context.Background(), key); err != nil {
			t.Fatal(err)
		}
		*k = secret
		if k == &e.owner {
			e.ownerKeyID = key.ID
		}
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	srv := server.New(server.Options{Manager: m, Keys: st, Log: log, Config: cfg.Config, Version: "test",
		E2B: &e2b.Options{Secret: []byte("test secret"), Domain: "kiln.test"}})
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	e.url = ts.URL
	return e
}

// create makes a sandbox through the API as the owner.
func (e *env) create(req api.CreateSandboxRequest) api.Sandbox {
	e.t.Helper()
	body, _ := json.Marshal(req)
	r, _ := http.NewRequest("POST", e.url+"/v1/sandboxes", bytes.NewReader(body))
	r.Header.Set("Authorization", "Bearer "+e.owner)
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	var sb api.Sandbox
	if resp.StatusCode != http.StatusCreated {
		b, _ := io.ReadAll(resp.Body)
		e.t.Fatalf("create: %s: %s", resp.Status, b)
	}
	if err := json.NewDecoder(resp.Body).Decode(&sb); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = e.m.Kill(context.Background(), sandbox.ID(sb.ID)) })
	return sb
}

// serve starts echoServer on port in sandbox id (on every address, or on
// bind) and waits for it.
func (e *env) serve(id string, port int, bind ...string) {
	e.t.Helper()
	e.start(id, port, append([]string{"python3", "-c", echoServer, fmt.Sprint(port)}, bind...)...)
}

// start runs a server (args) in sandbox id in the background and waits
// until it answers GET / on port.
func (e *env) start(id string, port int, args ...string) {
	e.t.Helper()
	a, err := e.m.Agent(sandbox.ID(id))
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.t.Cleanup(cancel)
	go a.Exec(ctx, wire.ExecParams{Args: args}, func(api.Event) error { return nil })
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if c, err := e.m.DialPort(ctx, sandbox.ID(id), port); err == nil {
			fmt.Fprintf(c, "GET / HTTP/1.0\r\n\r\n")
			_ = c.SetReadDeadline(time.Now().Add(time.Second))
			b, _ := io.ReadAll(c)
			c.Close()
			if bytes.HasPrefix(b, []byte("HTTP/1.")) && bytes.Contains(b, []byte(" 200 ")) {
				return
			}
		}
	}
	e.t.Fatalf("server on port %d of %s never answered", port, id)
}

// get sends GET path to port of sandbox id through the router, by host
// name, with extra headers; it returns the status and body.
func (e *env) get(id string, port int, path string, hdr map[string]string) (int, string) {
	e.t.Helper()
	r, _ := http.NewRequest("GET", e.url+path, nil)
	r.Host = fmt.Sprintf("%d-%s.kiln.test", port, id)
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestExposedPort(t *testing.T) {
	e := newEnv(t)
	sb := e.create(api.CreateSandboxRequest{Network: &api.Network{Mode: "nat"}})
	if sb.Network == nil || sb.Network.TrafficToken == "" || sb.Network.Public {
		t.Fatalf("create answered network %+v; want a private one with a token", sb.Network)
	}
	token := sb.Network.TrafficToken
	e.serve(sb.ID, 8080)

	cases := []struct {
		name   string
		port   int
		hdr    map[string]string
		status int
		body   string
	}{
		{"no credentials", 8080, nil, 403, ""},
		{"traffic token", 8080, map[string]string{"E2B-Traffic-Access-Token": token}, 200, "hello from /x?y=1"},
		{"wrong token", 8080, map[string]string{"E2B-Traffic-Access-Token": "nope"}, 403, ""},
		{"owner's API key", 8080, map[string]string{"Authorization": "Bearer " + e.owner}, 200, "hello from /x?y=1"},
		{"another key", 8080, map[string]string{"X-API-Key": e.other}, 403, ""},
		{"closed port", 8081, map[string]string{"E2B-Traffic-Access-Token": token}, 502, "port is not open"},
	}
	for _, c := range cases {
		status, body := e.get(sb.ID, c.port, "/x?y=1", c.hdr)
		if status != c.status || !strings.Contains(body, c.body) {
			t.Errorf("%s: %d %q; want %d %q", c.name, status, body, c.status, c.body)
		}
	}

	t.Run("header routing", func(t *testing.T) {
		r, _ := http.NewRequest("GET", e.url+"/h", nil)
		r.Header.Set("E2b-Sandbox-Id", sb.ID)
		r.Header.Set("E2b-Sandbox-Port", "8080")
		r.Header.Set("E2B-Traffic-Access-Token", token)
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != "hello from /h" {
			t.Errorf("%s %q", resp.Status, b)
		}
	})

	t.Run("websocket echo", func(t *testing.T) { wsEcho(t, e, sb.ID, 8080, http.Header{"E2b-Traffic-Access-Token": {token}}) })

	// A server bound to the sandbox's loopback only is reached through
	// the agent channel.
	e.serve(sb.ID, 9090, "127.0.0.1")
	t.Run("loopback server", func(t *testing.T) {
		if status, body := e.get(sb.ID, 9090, "/lo", map[string]string{"E2B-Traffic-Access-Token": token}); status != 200 || body != "hello from /lo" {
			t.Errorf("GET: %d %q", status, body)
		}
		wsEcho(t, e, sb.ID, 9090, http.Header{"E2b-Traffic-Access-Token": {token}})
	})

	t.Run("public", func(t *testing.T) {
		body, _ := json.Marshal(api.Network{Public: true})
		r, _ := http.NewRequest("PUT", e.url+"/v1/sandboxes/"+sb.ID+"/network", bytes.NewReader(body))
		r.Header.Set("Authorization", "Bearer "+e.owner)
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("PUT network: %s", resp.Status)
		}
		if status, body := e.get(sb.ID, 8080, "/p", nil); status != 200 || body != "hello from /p" {
			t.Errorf("public port without credentials: %d %q", status, body)
		}
	})

	t.Run("metrics", func(t *testing.T) {
		mt := metrics.New(nil)
		mt.RegisterNetwork(e.m)
		fams, err := mt.Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]float64{}
		for _, f := range fams {
			for _, m := range f.GetMetric() {
				if l := m.GetLabel(); len(l) == 1 && l[0].GetValue() == sb.ID {
					got[f.GetName()] = m.GetCounter().GetValue()
				}
			}
		}
		for _, name := range []string{"kiln_sandbox_network_sent_bytes_total", "kiln_sandbox_network_received_bytes_total"} {
			if got[name] <= 0 {
				t.Errorf("%s = %v after traffic; metrics %v", name, got[name], got)
			}
		}
		if _, ok := got["kiln_sandbox_network_policy_drops_total"]; !ok {
			t.Errorf("no policy drops counter: %v", got)
		}
	})

	t.Run("dead sandbox", func(t *testing.T) {
		if err := e.m.Kill(context.Background(), sandbox.ID(sb.ID)); err != nil {
			t.Fatal(err)
		}
		if status, _ := e.get(sb.ID, 8080, "/", map[string]string{"E2B-Traffic-Access-Token": token}); status != 502 {
			t.Errorf("killed sandbox: %d, want 502", status)
		}
	})
}

// wsEcho sends two messages (one larger than a channel frame) over a
// WebSocket to port of sandbox id and checks the echoes.
func wsEcho(t *testing.T, e *env, id string, port int, hdr http.Header) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, strings.Replace(e.url, "http", "ws", 1)+"/ws", &websocket.DialOptions{
		Host: fmt.Sprintf("%d-%s.kiln.test", port, id), HTTPHeader: hdr,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	c.SetReadLimit(1 << 20)
	for _, msg := range []string{"ping", strings.Repeat("kiln", 100_000)} {
		if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
			t.Fatal(err)
		}
		_, got, err := c.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != msg {
			t.Errorf("echo of %d bytes: got %d bytes", len(msg), len(got))
		}
	}
	c.Close(websocket.StatusNormalClosure, "")
}

// TestNoNetworkPort: a sandbox without a network (mode none) still serves
// its ports through the agent channel, to its owner only (it has no
// traffic token).
func TestNoNetworkPort(t *testing.T) {
	e := newEnv(t)
	sb := e.create(api.CreateSandboxRequest{Network: &api.Network{Mode: "none"}})
	if sb.Network != nil {
		t.Errorf("create without network answered %+v", sb.Network)
	}
	e.serve(sb.ID, 8080)
	owner := map[string]string{"Authorization": "Bearer " + e.owner}
	if status, body := e.get(sb.ID, 8080, "/n", owner); status != 200 || body != "hello from /n" {
		t.Errorf("owner: %d %q", status, body)
	}
	if status, _ := e.get(sb.ID, 8080, "/", nil); status != 403 {
		t.Errorf("no credentials: %d, want 403", status)
	}
	if status, _ := e.get(sb.ID, 8081, "/", owner); status != 502 {
		t.Errorf("closed port: %d, want 502", status)
	}
	wsEcho(t, e, sb.ID, 8080, http.Header{"Authorization": {"Bearer " + e.owner}})
}

// TestMaskHost: requests to the ports of a sandbox with a mask host carry
// it (with ${PORT} replaced) as their Host, the API shows it, a PUT
// changes it, a bad one is a 400 and a sandbox without one sees the host
// the client used.
func TestMaskHost(t *testing.T) {
	e := newEnv(t)
	if status, body := e.call("POST", "/v1/sandboxes", api.CreateSandboxRequest{
		Network: &api.Network{MaskHost: "http://app.internal/"}}); status != http.StatusBadRequest {
		t.Errorf("create with a bad mask host: %d %s, want 400", status, body)
	}
	sb := e.create(api.CreateSandboxRequest{Network: &api.Network{Public: true, MaskHost: "app.internal:${PORT}"}})
	if sb.Network == nil || sb.Network.MaskHost != "app.internal:${PORT}" {
		t.Fatalf("create answered network %+v", sb.Network)
	}
	e.serve(sb.ID, 8080)
	if status, body := e.get(sb.ID, 8080, "/host", nil); status != 200 || body != "app.internal:8080" {
		t.Errorf("Host seen in the sandbox: %d %q, want app.internal:8080", status, body)
	}
	if status, body := e.call("PUT", "/v1/sandboxes/"+sb.ID+"/network", api.Network{Public: true, MaskHost: "other.test"}); status != 200 ||
		!strings.Contains(body, `"mask_host":"other.test"`) {
		t.Errorf("PUT mask host: %d %s", status, body)
	}
	if status, body := e.get(sb.ID, 8080, "/host", nil); status != 200 || body != "other.test" {
		t.Errorf("Host after the PUT: %d %q, want other.test", status, body)
	}
	if status, body := e.call("PUT", "/v1/sandboxes/"+sb.ID+"/network", api.Network{Public: true, MaskHost: "a b"}); status != http.StatusBadRequest {
		t.Errorf("PUT a bad mask host: %d %s, want 400", status, body)
	}
	plain := e.create(api.CreateSandboxRequest{Network: &api.Network{Public: true}})
	e.serve(plain.ID, 8080)
	if status, body := e.get(plain.ID, 8080, "/host", nil); status != 200 || body != fmt.Sprintf("8080-%s.kiln.test", plain.ID) {
		t.Errorf("Host without a mask: %d %q", status, body)
	}
}

// call sends method path with body (JSON) to the API as the owner and
// returns the status and body.
func (e *env) call(method, path string, body any) (int, string) {
	e.t.Helper()
	b, _ := json.Marshal(body)
	r, _ := http.NewRequest(method, e.url+path, bytes.NewReader(b))
	r.Header.Set("Authorization", "Bearer "+e.owner)
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out)
}
