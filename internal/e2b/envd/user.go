package envd

import (
	"net/http"
	"strings"

	"connectrpc.com/connect"

	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// rpcUser is the user an RPC acts as: the username of the request's HTTP
// Basic credentials (envd's way of choosing a user; it is not
// authentication), else the sandbox's default user.
func rpcUser(h http.Header, sb sandbox.Sandbox) (string, error) {
	name, _, ok := (&http.Request{Header: h}).BasicAuth()
	if !ok || name == "" {
		return defaultUser(sb), nil
	}
	if !knownUser(name) {
		return "", rpcErrorf(connect.CodeUnauthenticated, "invalid username: '%s'", errdefs.Clip(name))
	}
	return name, nil
}

// fileUser is the user of a /files request: the username query
// parameter, else the default user.
func fileUser(name string, sb sandbox.Sandbox) (string, bool) {
	if name == "" {
		return defaultUser(sb), true
	}
	return name, knownUser(name)
}

func knownUser(name string) bool { return name == wire.UserDefault || name == wire.UserRoot }

func defaultUser(sb sandbox.Sandbox) string {
	if knownUser(sb.User) {
		return sb.User
	}
	return wire.UserDefault
}

// expandPath turns an envd path into one for the agent: empty means the
// sandbox's working directory (else the user's home), a leading ~ is the
// user's home, and other relative paths are relative to the home, which
// is how the agent reads them.
func expandPath(p string, sb sandbox.Sandbox) string {
	switch {
	case p == "" && sb.Workdir != "":
		return sb.Workdir
	case p == "" || p == "~":
		return "."
	case strings.HasPrefix(p, "~/"):
		return "./" + strings.TrimLeft(p[2:], "/")
	}
	return p
}
