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
func TestBuiltinTemplatesHaveTheUsualTools(t *testing.T) {
	tools := []struct{ name, cmd, want string }{
		{"curl", "curl --version", "curl "},
		{"wget", "wget --version", "GNU Wget"},
		{"sudo", "sudo -n true && sudo -n id -u", "0"},
		{"python", "python --version", "Python 3."},
		{"pip", "pip --version", "pip "},
		{"node", "node --version", "v"},
		{"npm", "npm --version", "."},
		{"ss", "ss -h", "Usage: ss"},
		{"git", "git --version", "git version"},
		{"ps", "ps -o comm= -p $$", "sh"},
		{"ca-certificates", "test -s /etc/ssl/certs/ca-certificates.crt && echo ok", "ok"},
	}
	sandboxtest.ForEachRuntime(t, func(t *testing.T, rt string) {
		scfg := sandboxtest.Config(t, agentPath)
		m := sandboxtest.NewManager(t, scfg)
		for _, name := range []string{"base", "code-interpreter"} {
			box := sandboxtest.Create(t, m, sandbox.CreateOptions{Template: name, Runtime: rt})
			for _, tool := range tools {
				r := box.Exec(wire.ExecParams{Args: []string{"/bin/sh", "-c", tool.cmd + " 2>&1"},
					User: box.SB.User, Cwd: box.SB.Workdir, Env: box.SB.Env, TimeoutMs: 60_000})
				if r.Exit.Code != 0 || !strings.Contains(r.Stdout, tool.want) {
					t.Errorf("%s: %s as %s: exit %d, output %q (want %q in it)", name, tool.cmd, box.SB.User, r.Exit.Code, r.Stdout, tool.want)
				}
			}
			_ = m.Kill(t.Context(), box.SB.ID)
		}
	})
}
