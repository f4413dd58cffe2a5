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
// sudo is checked as configured here (root's `sudo -l -U user` shows the
// passwordless rule); TestSudo runs it as the user.
func TestBuiltinTemplatesHaveTheUsualTools(t *testing.T) {
	tools := []struct {
		name, cmd, want string
		root            bool
	}{
		{"curl", "curl --version", "curl ", false},
		{"wget", "wget --version", "GNU Wget", false},
		{"sudo", "visudo -c -q && /usr/bin/sudo -n -l -U user", "(ALL : ALL) NOPASSWD: ALL", true},
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

// The user runs sudo without a password (E2B's users run `sudo apt-get
// install ...`), on both runtimes alike: gVisor ignores set-user-ID bits
// (google/gvisor#212), so the sudo first on PATH is the agent's client
// (/.kiln/bin/sudo), which has the agent (root, PID 1) run the command
// with the caller's stdio, cwd and environment (internal/agent/sudo). The
// template's /usr/bin/sudo stays; under runc it works too, and root
// through either holds the sandbox's capability set and seccomp filter,
// as root through the API does.
func TestSudo(t *testing.T) {
	type sudoCase struct {
		cmd, want string
		exit      int
		stderrHas string
	}
	sandboxtest.ForEachRuntime(t, func(t *testing.T, rt string) {
		m := sandboxtest.NewManager(t, sandboxtest.Config(t, agentPath))
		for _, name := range []string{"base", "code-interpreter"} {
			box := sandboxtest.Create(t, m, sandbox.CreateOptions{Template: name, Runtime: rt})
			as := func(cmd string) sandboxtest.Result {
				return box.Exec(wire.ExecParams{Args: []string{"/bin/sh", "-c", cmd}, User: box.SB.User,
					Cwd: box.SB.Workdir, Env: box.SB.Env, TimeoutMs: 60_000})
			}
			cases := []sudoCase{
				{cmd: "id -u", want: "1000"},
				{cmd: "command -v sudo", want: "/.kiln/bin/sudo"},
				{cmd: "sudo -n id -u", want: "0"},
				// A login shell (E2B's SDKs run commands with bash -l) resets
				// PATH; the agent's link in /usr/local/bin is on it.
				{cmd: "bash -l -c 'command -v sudo; sudo -n id -u'", want: "/usr/local/bin/sudo\n0"},
				{cmd: "sudo apt-get --version | head -n 1 | cut -d ' ' -f 1", want: "apt"},
				{cmd: "echo hi | sudo tee /etc/x >/dev/null && cat /etc/x && stat -c %U /etc/x", want: "hi\nroot"},
				{cmd: "sudo -u user id -un", want: "user"},
				{cmd: "cd /tmp && sudo pwd", want: "/tmp"},
				{cmd: "sudo sh -c 'exit 7'", exit: 7},
				{cmd: "sudo sh -c 'kill -TERM $$'", exit: 128 + 15},
				{cmd: "KEEP=kept sudo -E env | grep '^KEEP='", want: "KEEP=kept"},
				{cmd: "KEEP=kept sudo env | grep '^KEEP=' || echo reset", want: "reset"},
				{cmd: "sudo FOO=bar sh -c 'echo $FOO $SUDO_USER'", want: "bar user"},
				{cmd: "sudo -i pwd", want: "/root"},
				{cmd: "sudo -s echo '$USER'", want: "root"},
				{cmd: "sudo --frobnicate true", exit: 1, stderrHas: "sudo: unknown option --frobnicate"},
				{cmd: "sudo no-such-command", exit: 1, stderrHas: "no-such-command: command not found"},
			}
			if rt == "runc" {
				// Root through sudo holds the sandbox's capabilities
				// (internal/oci defaultCaps) under its seccomp filter,
				// through the agent's sudo and the template's setuid one.
				const caps = "CapEff: 00000000200405fb\nCapBnd: 00000000200405fb\nNoNewPrivs: 0\nSeccomp: 2"
				for _, sudo := range []string{"sudo", "/usr/bin/sudo"} {
					cases = append(cases, sudoCase{cmd: sudo + " -n grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status | tr -s '\\t ' ' '", want: caps})
				}
			}
			for _, c := range cases {
				r := as(c.cmd)
				if r.Exit.Code != c.exit || (c.want != "" && strings.TrimSpace(r.Stdout) != c.want) || !strings.Contains(r.Stderr, c.stderrHas) {
					t.Errorf("%s: %s as %s: exit %d, stdout %q, stderr %q; want exit %d, stdout %q, stderr with %q",
						name, c.cmd, box.SB.User, r.Exit.Code, r.Stdout, r.Stderr, c.exit, c.want, c.stderrHas)
				}
			}
			if name == "base" {
				// The broker survives a pause (runsc: a checkpoint and
				// restore of the agent and its socket).
				if _, err := m.Pause(t.Context(), box.SB.ID); err != nil {
					t.Fatalf("pause: %v", err)
				}
				if _, err := m.Resume(t.Context(), box.SB.ID); err != nil {
					t.Fatalf("resume: %v", err)
				}
				var err error
				if box.Agent, err = m.Agent(box.SB.ID); err != nil {
					t.Fatal(err)
				}
				if r := as("sudo -n id -u"); r.Exit.Code != 0 || strings.TrimSpace(r.Stdout) != "0" {
					t.Errorf("sudo after a pause: exit %d, %q %q", r.Exit.Code, r.Stdout, r.Stderr)
				}
			}
			_ = m.Kill(t.Context(), box.SB.ID)
		}
	})
}
