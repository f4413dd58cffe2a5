package e2b_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kiln-sh/kiln/internal/e2b"
	"github.com/kiln-sh/kiln/internal/e2b/envd/spec/filesystem"
	"github.com/kiln-sh/kiln/internal/e2b/envd/spec/process"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/server"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// probe is one request of the route walk.
type probe struct {
	name   string // "METHOD /pattern" (as registered) and how it is routed
	method string
	path   string
	hdr    []string
	body   string
	want   int
}

// publicRoutes are the routes anyone may call, with their status; every
// other route must refuse a request without credentials.
var publicRoutes = map[string]int{
	"native GET /healthz":           http.StatusOK,
	"control GET /health":           http.StatusOK,
	"jupyter GET /health":           http.StatusOK,
	"envd GET /health":              http.StatusNoContent,
	"envd OPTIONS /files preflight": http.StatusNoContent,
}

// envdREST are envd's plain-HTTP routes (envd.New registers them; its mux
// cannot be listed). Its Connect procedures are listed from the proto
// descriptors, so a new one is walked without a change here.
var envdREST = []string{"GET /health", "GET /envs", "GET /files", "POST /files"}

// walkBody is a body that would leave a trace in the sandbox if a route
// ran it: files named walk-*, a context, a process.
func walkBody(pattern string) string {
	switch {
	case strings.Contains(pattern, "Process/Start"):
		return `{"process":{"cmd":"/bin/touch","args":["/tmp/walk-start"]}}`
	case strings.Contains(pattern, "MakeDir"):
		return `{"path":"/tmp/walk-mkdir"}`
	case strings.Contains(pattern, "Move"):
		return `{"source":"/tmp/keep","destination":"/tmp/walk-moved"}`
	case strings.Contains(pattern, "Remove"):
		return `{"path":"/tmp/keep"}`
	case strings.Contains(pattern, "/execute"):
		return `{"code":"open('/tmp/walk-execute','w')"}`
	case strings.Contains(pattern, "/contexts"):
		return `{"language":"python","cwd":"/tmp"}`
	case strings.Contains(pattern, "/commands"):
		return `{"cmd":"touch /tmp/walk-command"}`
	case strings.Contains(pattern, "/code"):
		return `{"code":"open('/tmp/walk-code','w')"}`
	case strings.HasPrefix(pattern, "POST") || strings.HasPrefix(pattern, "PUT"):
		return `{"templateID":"base","path":"/tmp/walk-any"}`
	}
	return ""
}

// fill substitutes a pattern's wildcards.
func fill(path, id, ctxID string) string {
	r := strings.NewReplacer("{id}", id, "{pid}", "1", "{ctx}", ctxID, "{name}", "walk", "{sandboxID}", id)
	path = r.Replace(path)
	if strings.Contains(path, "/files") {
		path += "?path=/tmp/walk-file"
	}
	return path
}

func split(pattern string) (method, path string) {
	method, path, _ = strings.Cut(pattern, " ")
	return method, path
}

// routeWalk lists a probe for every registered route of every API and
// port, routed as a client would, with the credential headers cred adds
// (for port: envd's, the code interpreter's or another's); ctxID is a
// code context of sandbox id.
func routeWalk(t *testing.T, id, ctxID string, cred func(port int) []string) []probe {
	var ps []probe
	add := func(api, pattern string, hdr []string) {
		method, path := split(pattern)
		want, public := publicRoutes[api+" "+pattern]
		if !public {
			want = 0 // decided by the caller: a refusal
		}
		ps = append(ps, probe{name: api + " " + pattern, method: method, path: fill(path, id, ctxID), hdr: hdr, body: walkBody(pattern), want: want})
	}
	native := server.Routes()
	if len(native) < 40 {
		t.Fatalf("server.Routes() lists %d routes: the walk needs them all", len(native))
	}
	for _, p := range native {
		add("native", p, nil)
	}
	control, jupyter := e2b.New(e2b.Options{}).Routes()
	for _, p := range control {
		add("control", p, nil)
	}
	routed := func(port int) []string {
		return append([]string{"E2b-Sandbox-Id", id, "E2b-Sandbox-Port", strconv.Itoa(port)}, cred(port)...)
	}
	hosted := func(port int) []string {
		return append([]string{"Host", fmt.Sprintf("%d-%s.kiln.test", port, id)}, cred(port)...)
	}
	for _, p := range jupyter {
		add("jupyter", p, routed(e2b.JupyterPort))
		add("jupyter", p, hosted(e2b.JupyterPort))
	}
	envdRoutes := append(slices.Clone(envdREST),
		procedures(process.File_process_process_proto, filesystem.File_filesystem_filesystem_proto)...)
	if len(envdRoutes) < len(envdREST)+15 {
		t.Fatalf("envd routes %v: the proto descriptors list too few procedures", envdRoutes)
	}
	for _, p := range envdRoutes {
		hdr := routed(e2b.EnvdPort)
		if strings.Contains(p, ".") {
			hdr = append(hdr, "Content-Type", "application/json")
		}
		add("envd", p, hdr)
		add("envd", p, append(hosted(e2b.EnvdPort), "Content-Type", "application/json"))
	}
	// A CORS preflight is public (browsers send no credentials with it).
	ps = append(ps, probe{name: "envd OPTIONS /files preflight", method: "OPTIONS", path: "/files",
		hdr: append(routed(e2b.EnvdPort), "Access-Control-Request-Method", "POST", "Origin", "http://example.com"), want: http.StatusNoContent})
	// Exposed ports: the sandbox has no network, so its ports are not
	// public.
	for _, port := range []int{8080, 3000} {
		ps = append(ps, probe{name: fmt.Sprintf("port %d GET /", port), method: "GET", path: "/", hdr: routed(port)},
			probe{name: fmt.Sprintf("port %d POST / by host", port), method: "POST", path: "/upload", hdr: hosted(port), body: "data"})
	}
	// Signed /files URLs: a signature no sandbox made.
	ps = append(ps, probe{name: "signed GET /files", method: "GET", path: "/files?path=/etc/hostname&signature=v1_forged", want: 0},
		probe{name: "signed POST /files", method: "POST", path: "/files?path=/tmp/walk-signed&signature=v1_forged", body: "x", want: 0})
	return ps
}

// procedures lists the Connect procedures of proto files, as routes.
func procedures(fds ...protoreflect.FileDescriptor) []string {
	var out []string
	for _, fd := range fds {
		for i := range fd.Services().Len() {
			sv := fd.Services().Get(i)
			for j := range sv.Methods().Len() {
				out = append(out, fmt.Sprintf("POST /%s/%s", sv.FullName(), sv.Methods().Get(j).Name()))
			}
		}
	}
	return out
}

// TestEveryRouteNeedsCredentials walks every registered route of the
// native API, E2B's control plane, envd, the code interpreter and the
// exposed-port proxy (routed by headers and by host) without credentials,
// and with another tenant's sandbox's credentials: each is refused (401
// or 403) but the public ones, and nothing happens in the sandbox.
func TestEveryRouteNeedsCredentials(t *testing.T) {
	h := newHarness(t, "code-interpreter")
	sb := h.create(h.a, map[string]any{"templateID": "code-interpreter"})
	other := h.create(h.b, map[string]any{"templateID": "base"})
	if sb.TrafficAccessToken == nil || other.TrafficAccessToken == nil {
		t.Fatalf("created %+v, %+v: want traffic access tokens", sb, other)
	}
	token := []string{"X-Access-Token", sb.EnvdAccessToken}
	envdCall := func(path, ctype, body string) (int, []byte) {
		t.Helper()
		status, _, b := h.callRaw("POST", path, body, append(slices.Clone(token), "E2b-Sandbox-Id", sb.SandboxID,
			"E2b-Sandbox-Port", strconv.Itoa(e2b.EnvdPort), "Content-Type", ctype)...)
		return status, b
	}
	if status, b := envdCall("/files?path=/tmp/keep", "application/octet-stream", "kept"); status != 200 {
		t.Fatalf("writing /tmp/keep: %d %s", status, b)
	}
	contexts := func(hdr ...string) (int, []string) {
		t.Helper()
		status, _, b := h.call("GET", "/contexts", nil, append([]string{"E2b-Sandbox-Id", sb.SandboxID,
			"E2b-Sandbox-Port", strconv.Itoa(e2b.JupyterPort)}, hdr...)...)
		var cs []struct{ ID string }
		_ = json.Unmarshal(b, &cs)
		var ids []string
		for _, c := range cs {
			ids = append(ids, c.ID)
		}
		slices.Sort(ids)
		return status, ids
	}
	var c struct{ ID string }
	status, _, b := h.call("POST", "/contexts", map[string]any{"language": "python", "cwd": "/tmp"}, jupyter(sb, false)...)
	if err := json.Unmarshal(b, &c); status != 200 || err != nil || c.ID == "" {
		t.Fatalf("creating a context with the traffic token (as the SDKs send it): %d %s", status, b)
	}
	status, before := contexts("E2B-Traffic-Access-Token", *sb.TrafficAccessToken)
	if status != 200 || !slices.Contains(before, c.ID) {
		t.Fatalf("contexts with the traffic token: %d %v, want %s among them", status, before, c.ID)
	}
	live := len(h.m.Live())

	for _, pass := range []struct {
		name string
		cred func(port int) []string
	}{
		{"no credentials", func(int) []string { return nil }},
		{"another tenant's sandbox's credentials", func(int) []string {
			return []string{"X-Access-Token", other.EnvdAccessToken, "E2B-Traffic-Access-Token", *other.TrafficAccessToken, "X-API-Key", h.b}
		}},
		{"malformed credentials", func(int) []string {
			return []string{"X-Access-Token", "x", "E2B-Traffic-Access-Token", "x", "Authorization", "Bearer e2b_nope"}
		}},
	} {
		t.Run(pass.name, func(t *testing.T) {
			h := h.with(t)
			ps := routeWalk(t, sb.SandboxID, c.ID, pass.cred)
			for _, p := range ps {
				status, _, b := h.callRaw(p.method, p.path, p.body, p.hdr...)
				switch {
				case p.want != 0 && status != p.want:
					t.Errorf("%s (public): %d %s, want %d", p.name, status, b, p.want)
				case p.want == 0 && status != http.StatusUnauthorized && status != http.StatusForbidden:
					t.Errorf("%s %s %v: %d %.200s, want 401 or 403", p.name, p.path, p.hdr, status, b)
				}
			}
			for name := range publicRoutes {
				if !slices.ContainsFunc(ps, func(p probe) bool { return p.name == name }) {
					t.Errorf("public route %q is not registered any more: update publicRoutes", name)
				}
			}
		})
	}

	// Nothing happened: no file, process, context or sandbox was made or
	// removed, and both sandboxes still run.
	status, b = envdCall("/filesystem.Filesystem/ListDir", "application/json", `{"path":"/tmp","depth":1}`)
	var dir struct{ Entries []struct{ Name string } }
	if err := json.Unmarshal(b, &dir); status != 200 || err != nil {
		t.Fatalf("ListDir /tmp: %d %s", status, b)
	}
	kept := false
	for _, e := range dir.Entries {
		kept = kept || e.Name == "keep"
		if strings.HasPrefix(e.Name, "walk") {
			t.Errorf("the walk left /tmp/%s in the sandbox", e.Name)
		}
	}
	if !kept {
		t.Error("the walk removed /tmp/keep")
	}
	if _, after := contexts("X-Access-Token", sb.EnvdAccessToken); !slices.Equal(after, before) {
		t.Errorf("contexts %v after the walk, %v before", after, before)
	}
	if n := len(h.m.Live()); n != live {
		t.Errorf("%d live sandboxes after the walk, %d before", n, live)
	}
	for _, s := range []struct{ id, key string }{{sb.SandboxID, h.a}, {other.SandboxID, h.b}} {
		var d struct{ State string }
		h.api("GET", "/sandboxes/"+s.id, s.key, nil, http.StatusOK, &d)
		if d.State != "running" {
			t.Errorf("sandbox %s is %s after the walk", s.id, d.State)
		}
	}

	// The credentials that open the data plane.
	for _, tc := range []struct {
		name string
		hdr  []string
		want int
	}{
		{"access token", token, 200},
		{"traffic token", []string{"E2B-Traffic-Access-Token", *sb.TrafficAccessToken}, 200},
		{"owner's key", []string{"X-API-Key", h.a}, 200},
		{"owner's key as bearer", []string{"Authorization", "Bearer " + h.a}, 200},
		{"another tenant's key", []string{"X-API-Key", h.b}, 401},
	} {
		if status, _ := contexts(tc.hdr...); status != tc.want {
			t.Errorf("GET /contexts with the %s: %d, want %d", tc.name, status, tc.want)
		}
	}
	ownerEnvd := []string{"E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", strconv.Itoa(e2b.EnvdPort), "X-API-Key", h.a}
	if status, _, b := h.call("GET", "/envs", nil, ownerEnvd...); status != 200 {
		t.Errorf("envd GET /envs with the owner's key: %d %s", status, b)
	}
	// Past the check, an exposed port nothing listens on answers 502.
	for _, hdr := range [][]string{{"E2B-Traffic-Access-Token", *sb.TrafficAccessToken}, {"X-API-Key", h.a}} {
		status, _, b := h.call("GET", "/", nil, append([]string{"E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", "8080"}, hdr...)...)
		if status != http.StatusBadGateway {
			t.Errorf("port 8080 with %s: %d %s, want 502 (not listening)", hdr[0], status, b)
		}
	}
	if got := *sb.TrafficAccessToken; got != e2b.TrafficToken(h.secret, sandbox.ID(sb.SandboxID)) {
		t.Errorf("traffic token %q: want TrafficToken (the sandbox has no network)", got)
	}
}

// callRaw is call with a raw body ("": none).
func (h *harness) callRaw(method, path, body string, hdr ...string) (int, http.Header, []byte) {
	h.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, h.ts.URL+path, rd)
	if err != nil {
		h.t.Fatal(err)
	}
	return h.do(req, hdr...)
}
