package sandbox_test

import (
	"testing"

	"github.com/kiln-sh/kiln/internal/sandbox"
)

// localhostProbe resolves localhost and the sandbox's own name through
// getaddrinfo (as Python, node and Java clients do; curl resolves
// localhost by itself) and fetches from a server the sandbox runs on
// localhost.
const localhostProbe = `python3 - <<'EOF'
import http.server, socket, threading, urllib.request
print(socket.gethostbyname("localhost"), socket.gethostbyname(socket.gethostname()) != "")
srv = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
threading.Thread(target=srv.serve_forever, daemon=True).start()
print(urllib.request.urlopen("http://localhost:%d/" % srv.server_port, timeout=10).status)
EOF`

// TestLocalhost: every sandbox resolves localhost and its own name, cold
// or restored from a warm checkpoint, though no template's layers carry
// an /etc/hosts (the agent writes one; a template's own is kept).
func TestLocalhost(t *testing.T) {
	cfg := testConfig(t)
	requireCodeInterpreter(t, cfg)
	m := newManager(t, cfg)
	forEachRuntime(t, func(t *testing.T, rt string) {
		for _, tmpl := range []string{"base", codeInterpreter} { // runsc restores code-interpreter's warm checkpoint
			e := create(t, m, sandbox.CreateOptions{Runtime: rt, Template: tmpl})
			if r := e.Sh(localhostProbe); r.Exit.Code != 0 || r.Stdout != "127.0.0.1 True\n200\n" {
				t.Errorf("%s on %s: %q %q %+v", tmpl, rt, r.Stdout, r.Stderr, r.Exit)
			}
		}
	})
}
