package envd

import (
	"log/slog"
	"net/http"

	"github.com/kiln-sh/kiln/internal/sandbox"
)

// Options configure a Handler.
type Options struct {
	Log *slog.Logger
}

// Handler serves envd requests for any sandbox; the router in package e2b
// resolves which one.
type Handler struct {
	log *slog.Logger
}

// New returns a Handler.
func New(o Options) *Handler {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return &Handler{log: o.Log}
}

// ServeSandbox serves one envd request for sandbox sb, reached through its
// agent a; token is sb's access token (X-Access-Token). The router has
// already checked that sb exists, belongs to nobody else's routing and is
// running.
func (h *Handler) ServeSandbox(w http.ResponseWriter, r *http.Request, sb sandbox.Sandbox, a *sandbox.Agent, token string) {
	http.Error(w, "envd: not implemented yet", http.StatusNotImplemented)
}

// Signed reports whether r, a GET or POST /files without routing headers
// (a sandbox.downloadUrl()/uploadUrl() URL), carries a valid, unexpired
// signature made with token.
func Signed(r *http.Request, token string) bool { return false }
