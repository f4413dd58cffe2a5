package envd

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"

	"connectrpc.com/connect"

	"github.com/kiln-sh/kiln/internal/e2b/envd/spec/filesystem/filesystemconnect"
	"github.com/kiln-sh/kiln/internal/e2b/envd/spec/process/processconnect"
	"github.com/kiln-sh/kiln/internal/edge"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// Options configure a Handler.
type Options struct {
	Log *slog.Logger
	// Edge is the server's HTTP edge: what a client may see of an error
	// (an unclassified one is logged and replaced by a generic message).
	// nil: no log, no host directories to scrub.
	Edge *edge.Edge
	// OutputLimit caps the output the agent delivers per process (E2B
	// has no cap; the agent's own default is 16 MiB); 0 means
	// DefaultOutputLimit.
	OutputLimit int64
}

// maxMessage bounds one RPC message a client sends (stdin data is the
// only large one): Connect reads a whole message into memory before the
// handler sees it, so this is what each call may hold. Larger input goes
// through StreamInput in several messages (the SDKs' stdin calls send
// what the user passed in one message; envd sets no limit).
const maxMessage = 4 << 20

// DefaultOutputLimit is the per-process output cap when Options names
// none: kiln serve's largest allowed output limit by default.
const DefaultOutputLimit = 1 << 30

// Handler serves envd requests for any sandbox; the router in package e2b
// resolves which one.
type Handler struct {
	log      *slog.Logger
	edge     *edge.Edge
	outLimit int64
	mux      *http.ServeMux
	watchers *watchers
}

// New returns a Handler.
func New(o Options) *Handler {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.OutputLimit <= 0 {
		o.OutputLimit = DefaultOutputLimit
	}
	h := &Handler{log: o.Log, edge: o.Edge, outLimit: o.OutputLimit, mux: http.NewServeMux(), watchers: newWatchers()}
	opts := connect.WithHandlerOptions(connect.WithReadMaxBytes(maxMessage), connect.WithInterceptors(scrub{o.Edge}))
	h.mux.Handle(processconnect.NewProcessHandler(processService{h}, opts))
	h.mux.Handle(filesystemconnect.NewFilesystemHandler(filesystemService{h}, opts))
	h.mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	h.mux.HandleFunc("GET /envs", h.envs)
	h.mux.HandleFunc("GET /files", h.download)
	h.mux.HandleFunc("POST /files", h.upload)
	return h
}

// ServeSandbox serves one envd request for sandbox sb, reached through its
// agent a; token is sb's access token (X-Access-Token). The router has
// already checked that sb exists, belongs to nobody else's routing and is
// running.
func (h *Handler) ServeSandbox(w http.ResponseWriter, r *http.Request, sb sandbox.Sandbox, a *sandbox.Agent, token string) {
	if cors(w, r) {
		return
	}
	if msg, ok := authorized(r, token); !ok {
		writeError(w, http.StatusUnauthorized, msg)
		return
	}
	ctx := context.WithValue(r.Context(), targetKey{}, &target{sb: sb, agent: a, edge: h.edge})
	h.mux.ServeHTTP(w, r.WithContext(ctx))
}

// cors allows browsers' SDKs, as envd does (any origin, method and
// header), and answers preflight requests, which it reports.
func cors(w http.ResponseWriter, r *http.Request) bool {
	hd := w.Header()
	hd.Set("Access-Control-Allow-Origin", "*")
	hd.Set("Access-Control-Expose-Headers", "Connect-Protocol-Version, Connect-Content-Encoding, Grpc-Status, Grpc-Message, "+
		"Grpc-Status-Details-Bin, Content-Encoding, Content-Disposition, Location, Cache-Control, X-Content-Type-Options")
	if r.Method != http.MethodOptions || r.Header.Get("Access-Control-Request-Method") == "" {
		return false
	}
	hd.Set("Access-Control-Allow-Methods", "HEAD, GET, POST, PUT, PATCH, DELETE")
	hd.Set("Access-Control-Allow-Headers", "*")
	hd.Set("Access-Control-Max-Age", "7200")
	w.WriteHeader(http.StatusNoContent)
	return true
}

// target is the sandbox a request is for.
type target struct {
	sb    sandbox.Sandbox
	agent *sandbox.Agent
	edge  *edge.Edge
}

type targetKey struct{}

// targetOf returns the sandbox ServeSandbox put into ctx.
func targetOf(ctx context.Context) *target {
	t, _ := ctx.Value(targetKey{}).(*target)
	if t == nil {
		panic("envd: request did not come through ServeSandbox")
	}
	return t
}

// envs answers the sandbox's global environment variables.
func (h *Handler) envs(w http.ResponseWriter, r *http.Request) {
	env := targetOf(r.Context()).sb.Env
	if env == nil {
		env = map[string]string{}
	}
	writeJSON(w, http.StatusOK, env)
}

// writeError answers envd's plain-HTTP error body.
func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{status, errdefs.ClipMessage(msg, maxErrorMessage)})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
