package sandbox_test

import (
	"context"
	"testing"

	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/sandbox/sandboxtest"
)

// localhostProbe resolves localhost through getaddrinfo (as Python's,
// node's and Java's clients do; curl resolves localhost by itself) and
// fetches from a server the sandbox runs on localhost.
const localhostProbe = `python3 - <<'EOF'
import http.server, socket, threading, urllib.request
print(socket.gethostbyname("localhost"))
srv = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
threading.Thread(target=srv.serve_forever, daemon=True).start()
print(urllib.request.urlopen("http://localhost:%d/" % srv.server_port, timeout=10).status)
EOF`

// TestLocalhost: every sandbox resolves localhost, booted cold, restored
// from a warm checkpoint (runsc restores code-interpreter's) or forked,
// though no template's layers carry an /etc/hosts.
func TestLocalhost(t *testing.T) {
	cfg := testConfig(t)
	requireCodeInterpreter(t, cfg)
	m, im := newImages(t, cfg)
	probe := func(t *testing.T, what string, e *env) {
		t.Helper()
		if r := e.Sh(localhostProbe); r.Exit.Code != 0 || r.Stdout != "127.0.0.1\n200\n" {
			t.Errorf("%s: %q %q %+v", what, r.Stdout, r.Stderr, r.Exit)
		}
	}
	forEachRuntime(t, func(t *testing.T, rt string) {
		for _, tmpl := range []string{"base", codeInterpreter} {
			e := create(t, m, sandbox.CreateOptions{Runtime: rt, Template: tmpl})
			probe(t, tmpl, e)
			if rt != "runsc" || tmpl != codeInterpreter {
				continue
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
			fork := sandboxtest.Wrap(t, m, sbs[0], a)
			probe(t, "fork", fork)
		}
	})
}
