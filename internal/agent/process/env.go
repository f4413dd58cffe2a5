package process

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// DefaultPath is PATH when neither the sandbox nor the caller sets one.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// User is the account a process runs as.
type User struct {
	Name   string
	UID    uint32
	GID    uint32
	Groups []uint32 // supplementary groups
	Home   string
	Shell  string // may be empty
}

// buildEnv layers, lowest first: defaults (PATH, LANG=C.UTF-8), the
// sandbox's base environment, the user's identity (HOME, USER, LOGNAME,
// SHELL), TERM for terminals, then the caller's variables; pathDir (if
// set) then goes first on PATH. Keys are sorted so that children see a
// stable environment.
func buildEnv(base []string, u User, pty bool, extra map[string]string, pathDir string) []string {
	env := map[string]string{"PATH": DefaultPath, "LANG": "C.UTF-8"}
	for _, kv := range base {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			env[k] = v
		}
	}
	env["HOME"] = u.Home
	env["USER"] = u.Name
	env["LOGNAME"] = u.Name
	if u.Shell != "" {
		env["SHELL"] = u.Shell
	}
	if pty {
		if _, ok := env["TERM"]; !ok {
			env["TERM"] = "xterm-256color"
		}
	}
	for k, v := range extra {
		env[k] = v
	}
	env["PATH"] = PrependPath(env["PATH"], pathDir)
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}

// getenv looks key up in an environment list.
func getenv(env []string, key string) string {
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v
		}
	}
	return ""
}

// PrependPath puts dir first on the search path path, unless dir is ""
// or already on it: the agent's own commands (sudo, see package sudo)
// come before the template's.
func PrependPath(path, dir string) string {
	switch {
	case dir == "" || slices.Contains(filepath.SplitList(path), dir):
		return path
	case path == "":
		return dir
	}
	return dir + string(filepath.ListSeparator) + path
}

// LookPath finds an executable the way a shell would, using the child's
// PATH rather than the agent's.
func LookPath(file, path string) (string, bool) {
	if strings.Contains(file, "/") {
		return file, isExecutable(file)
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, file)
		if isExecutable(p) {
			return p, true
		}
	}
	return "", false
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}
