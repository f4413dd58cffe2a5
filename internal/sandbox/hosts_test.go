package sandbox_test

import (
	"context"
	"strings"
	"testing"

	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/sandbox/sandboxtest"
)

// localhostProbe resolves localhost and the sandbox's hostname through
// getaddrinfo (as Python's, node's and Java's clients do; curl resolves
// localhost by itself), fetches from a server the sandbox runs on
// localhost, and says how often /etc/hosts names the hostname.
const localhostProbe = `python3 - <<'EOF'
import http.server, socket, threading, urllib.request
print(socket.gethostbyname("localhost"), socket.gethostbyname(socket.gethostname()))
srv = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
threading.Thread(target=srv.serve_forever, daemon=True).start()
print(urllib.request.urlopen("http://localhost:%d/" % srv.server_port, timeout=10).status)
EOF
grep -cw "$(hostname)" /etc/hosts`

// TestLocalhost: every sandbox resolves localhost and its own hostname,
// booted cold, restored from a warm checkpoint or forked (a restored
// sandbox has its source's /etc/hosts, renamed), though no template's
// layers carry an /etc/hosts.
func TestLocalhost(t *testing.T) {
	cfg := testConfig(t)
	requireCodeInterpreter(t, cfg)
	m, im, logs := newLoggedManager(t, cfg, runtimes(cfg.Config))
	buildWarm(t, im)
	probe := func(t *testing.T, what string, e *env) {
		t.Helper()
		if r := e.Sh(localhostProbe); r.Exit.Code != 0 || r.Stdout != "127.0.0.1 127.0.1.1\n200\n1\n" {
			t.Errorf("%s: %q %q %+v", what, r.Stdout, r.Stderr, r.Exit)
		}
		if r := e.Sh("hostname"); r.Stdout != e.SB.ID.String()+"\n" {
			t.Errorf("%s: hostname %q, want its id %s", what, r.Stdout, e.SB.ID)
		}
	}
	forEachRuntime(t, func(t *testing.T, rt string) {
		for _, tmpl := range []string{"base", codeInterpreter} {
			e := create(t, m, sandbox.CreateOptions{Runtime: rt, Template: tmpl})
			probe(t, tmpl, e)
			if rt != "runsc" || tmpl != codeInterpreter {
				continue
			}
			if n := strings.Count(logs.String(), "from=\"warm checkpoint\""); n != 1 {
				t.Errorf("%d creates restored the warm checkpoint, want 1", n)
			}
			sbs, err := im.Fork(context.Background(), e.SB.ID, 1, sandbox.Quota{})
			if err != nil {
				t.Fatalf("fork: %v", err)
			}
			t.Cleanup(func() { _ = m.Kill(context.Background(), sbs[0].ID) })
			a, err := m.Agent(sbs[0].ID)
			if err != nil {
				t.Fatal(err)
			}
			probe(t, "fork", sandboxtest.Wrap(t, m, sbs[0], a))
		}
	})
}
