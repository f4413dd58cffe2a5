package sudo

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/kiln-sh/kiln/internal/agent/process"
)

// command is a resolved command to start.
type command struct {
	path string // the executable
	argv []string
	dir  string
	env  []string
	user process.User
}

// keptVars are the caller's variables that survive sudo's environment
// reset (as in sudo's env_keep defaults), besides LC_*.
var keptVars = []string{"TERM", "COLORTERM", "DISPLAY", "XAUTHORITY", "LANG", "LANGUAGE", "TZ",
	"COLORS", "LS_COLORS", "KILN_SANDBOX_ID"}

// resolve turns an invocation by caller into the command to start.
func (b *Broker) resolve(inv invocation, req request, caller process.User) (command, error) {
	for _, s := range append(append(slices.Clone(req.Args), req.Env...), req.Cwd) {
		if strings.ContainsRune(s, 0) {
			return command{}, fmt.Errorf("an argument or variable contains a NUL byte")
		}
	}
	name := inv.user
	switch {
	case name == "":
		name = "root"
	case strings.HasPrefix(name, "#"):
		name = name[1:]
	}
	target, err := b.Lookup(name)
	if err != nil {
		return command{}, fmt.Errorf("unknown user %s", strconv.Quote(inv.user))
	}
	c := command{user: target, dir: req.Cwd}
	c.env = commandEnv(inv, req.Env, caller, target, b.PathDir)
	if inv.login {
		c.dir = target.Home
		if fi, err := os.Stat(c.dir); err != nil || !fi.IsDir() {
			c.dir = "/"
		}
	} else if fi, err := os.Stat(c.dir); !filepath.IsAbs(c.dir) || err != nil || !fi.IsDir() {
		return command{}, fmt.Errorf("unable to change directory to %s", strconv.Quote(req.Cwd))
	}
	switch {
	case inv.login || inv.shell:
		shell := target.Shell
		if inv.shell {
			shell = cmp.Or(getenv(req.Env, "SHELL"), caller.Shell)
		}
		c.path = cmp.Or(shell, "/bin/sh")
		c.argv = []string{c.path}
		if inv.login {
			c.argv[0] = "-" + filepath.Base(c.path)
		}
		if len(inv.cmd) > 0 {
			c.argv = append(c.argv, "-c", shellCommand(inv.cmd))
		}
	default:
		path, ok := process.LookPath(inv.cmd[0], getenv(c.env, "PATH"))
		if !ok {
			return command{}, fmt.Errorf("%s: command not found", inv.cmd[0])
		}
		c.path, c.argv = path, inv.cmd
	}
	return c, nil
}

// commandEnv is sudo's: the caller's environment reset to keptVars (all
// of it with -E), the target's identity, the secure PATH (the sandbox's
// default, behind the sudo client's dir), SUDO_* naming the caller, and
// the VAR=value assignments last.
func commandEnv(inv invocation, callerEnv []string, caller, target process.User, pathDir string) []string {
	env := map[string]string{}
	keep := !inv.login && inv.keepEnv
	for _, kv := range callerEnv {
		k, v, ok := strings.Cut(kv, "=")
		if ok && validName(k) && (keep || slices.Contains(keptVars, k) || slices.Contains(inv.keepVars, k) ||
			strings.HasPrefix(k, "LC_")) {
			env[k] = v
		}
	}
	if !keep || inv.setHome {
		env["HOME"] = target.Home
	}
	if !keep && target.Shell != "" {
		env["SHELL"] = target.Shell
	}
	env["USER"], env["LOGNAME"], env["MAIL"] = target.Name, target.Name, "/var/mail/"+target.Name
	env["PATH"] = process.PrependPath(process.DefaultPath, pathDir)
	env["SUDO_USER"] = caller.Name
	env["SUDO_UID"] = strconv.FormatUint(uint64(caller.UID), 10)
	env["SUDO_GID"] = strconv.FormatUint(uint64(caller.GID), 10)
	env["SUDO_COMMAND"] = truncate(strings.Join(inv.cmd, " "), 4096)
	for _, kv := range inv.assign {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}

// getenv looks key up in an environment list (the last one wins).
func getenv(env []string, key string) string {
	v := ""
	for _, kv := range env {
		if k, val, ok := strings.Cut(kv, "="); ok && k == key {
			v = val
		}
	}
	return v
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
