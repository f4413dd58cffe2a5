package builder_test

import (
	"strings"
	"testing"

	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/sandbox/sandboxtest"
)

// The built-in templates carry the tools E2B's images have and user code
// assumes (issue 17 item 9), and each runs as the sandbox's user. It needs
// the built-ins of the current recipes (make setup rebuilds them).
//
// sudo is checked as configured: root's `sudo -l -U user` shows the
// passwordless rule. Running it as the user fails while sandboxes run
// with no-new-privileges (internal/oci, docs/security.md: setuid binaries
// do not raise privileges), which stops every setuid binary.
func TestBuiltinTemplatesHaveTheUsualTools(t *testing.T) {
	tools := []struct {
		name, cmd, want string
		root            bool
	}{
		{"curl", "curl --version", "curl ", false},
		{"wget", "wget --version", "GNU Wget", false},
		{"sudo", "visudo -c -q && sudo -n -l -U user", "(ALL : ALL) NOPASSWD: ALL", true},
		{"python", "python --version", "Python 3.", false},
		{"pip", "pip --version", "pip ", false},
		{"node", "node --version", "v", false},
		{"npm", "npm --version", ".", false},
		{"ss", "ss -h", "Usage: ss", false},
		{"git", "git --version", "git version", false},
		{"ps", "ps -o comm= -p $$", "sh", false},
		{"ca-certificates", "test -s /etc/ssl/certs/ca-certificates.crt && echo ok", "ok", false},
	}
	sandboxtest.ForEachRuntime(t, func(t *testing.T, rt string) {
		scfg := sandboxtest.Config(t, agentPath)
		m := sandboxtest.NewManager(t, scfg)
		for _, name := range []string{"base", "code-interpreter"} {
			box := sandboxtest.Create(t, m, sandbox.CreateOptions{Template: name, Runtime: rt})
			for _, tool := range tools {
				user := box.SB.User
				if tool.root {
					user = wire.UserRoot
				}
				r := box.Exec(wire.ExecParams{Args: []string{"/bin/sh", "-c", tool.cmd + " 2>&1"},
					User: user, Cwd: box.SB.Workdir, Env: box.SB.Env, TimeoutMs: 60_000})
				if r.Exit.Code != 0 || !strings.Contains(r.Stdout, tool.want) {
					t.Errorf("%s: %s as %s: exit %d, output %q (want %q in it)", name, tool.cmd, user, r.Exit.Code, r.Stdout, tool.want)
				}
			}
			_ = m.Kill(t.Context(), box.SB.ID)
		}
	})
}
