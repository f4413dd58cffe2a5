package e2b

import (
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/e2b/envd"
	"github.com/kiln-sh/kiln/internal/edge"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/template"
	"github.com/kiln-sh/kiln/internal/template/builder"
	"github.com/kiln-sh/kiln/internal/volume"
)

// Options wire a Handler. internal/server fills in Manager, Images, Log
// and Edge; kiln serve supplies Secret (and the networking code PortProxy).
type Options struct {
	Manager *sandbox.Manager
	// Images serves snapshots and forks: the Manager's Images.
	Images *sandbox.Images
	// Secret keys the sandboxes' envd access tokens (see AccessToken).
	Secret []byte
	Log    *slog.Logger
	// Domain is returned to the SDKs as the sandboxes' domain, which they
	// use only for sandbox.getHost(port) (<port>-<id>.<domain>); "" sends
	// null, so the client's E2B_DOMAIN applies.
	Domain string
	// PortProxy serves data-plane requests for sandbox ports other than
	// envd's and the code interpreter's; nil answers E2B's "port is not
	// open" 502.
	PortProxy func(w http.ResponseWriter, r *http.Request, sb sandbox.Sandbox, port int)
	// Builder, Catalog (with its Store) and Limits serve E2B's template
	// build API (templates*.go) on Kiln's builder, as internal/server's
	// /v1/templates; nil Builder: the template routes answer 503.
	Builder *builder.Builder
	Catalog *template.Catalog
	Limits  config.Limits
	// Edge is the server's HTTP edge: API keys (the data plane uses them
	// too: an API key of a sandbox's owner opens its ports like the access
	// token), the cap on requests without credentials, errors' statuses
	// and messages, the request log and metrics. nil: no keys, no cap, no
	// log.
	Edge *edge.Edge
	// Volumes serves E2B's volume API (volumes.go) and create's
	// volumeMounts; nil: the volume routes answer 503.
	Volumes *volume.Manager
}

// Caller is who sent a control-plane request.
type Caller struct {
	Owner string        // the API key's id; sandboxes are owned by it
	Quota sandbox.Quota // what the key may hold at once
	// Admin keys may also use other keys' sandboxes' data planes (as on
	// the native API); the control plane shows each key only its own.
	Admin bool
}

// Handler serves E2B's control plane, routes the data plane to envd, the
// code interpreter or PortProxy, and answers header-less signed /files
// URLs.
type Handler struct {
	o       Options
	m       *sandbox.Manager
	im      *sandbox.Images
	log     *slog.Logger
	envd    *envd.Handler
	control *mux
	jupyter *mux
	usage   *cpuSampler
	// dying: sandboxes being killed, whose data plane answers 502 at
	// once rather than wait for the kill.
	dying sync.Map // sandbox.ID → struct{}
	edge  *edge.Edge
	// pending: template builds requested, waiting for their steps.
	pending pendingBuilds
}

// New returns a Handler.
func New(o Options) *Handler {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	h := &Handler{
		o: o, m: o.Manager, im: o.Images, log: o.Log.With("component", "e2b"),
		envd:    envd.New(envd.Options{Log: o.Log.With("component", "envd")}),
		control: newMux(), jupyter: newMux(),
		usage: newCPUSampler(), edge: o.Edge,
	}
	h.registerControl()
	h.registerJupyter()
	return h
}

// Routed reports whether r belongs to E2B's API rather than Kiln's
// native one (which lives under /v1/, /healthz and /metrics): data-plane
// requests (routing headers, a <port>-<id>.<domain> host, or a signed
// /files URL) and E2B's control-plane paths.
func Routed(r *http.Request) bool {
	if r.Header.Get(headerSandboxID) != "" || r.Header.Get(headerSandboxPort) != "" {
		return true
	}
	if _, _, ok := hostTarget(r.Host); ok {
		return true
	}
	if SignedFiles(r) {
		return true
	}
	p := r.URL.Path
	if p == "/health" {
		return true
	}
	for _, prefix := range []string{"/sandboxes", "/v2/", "/v3/", "/templates", "/snapshots", "/volumes", "/volumecontent"} {
		if p == prefix || strings.HasPrefix(p, prefix+"/") || (strings.HasSuffix(prefix, "/") && strings.HasPrefix(p, prefix)) {
			return true
		}
	}
	return false
}

// Routed is the package's Routed, and also picks every host under the
// sandboxes' domain (Options.Domain): one that names no sandbox port is
// answered 404 rather than served Kiln's API.
func (h *Handler) Routed(r *http.Request) bool {
	return Routed(r) || h.underDomain(r.Host)
}

// ServeHTTP serves a request h.Routed picked.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Header.Get(headerSandboxID) != "" || r.Header.Get(headerSandboxPort) != "":
		h.serveHeaderRouted(w, r)
	case SignedFiles(r):
		h.serveSignedFiles(w, r)
	default:
		if port, id, ok := hostTarget(r.Host); ok {
			h.serveData(w, r, id, port)
			return
		}
		if h.underDomain(r.Host) {
			WriteBadHost(w, r, h.o.Domain)
			return
		}
		h.control.ServeHTTP(w, r)
	}
}

// problem is the edge's status and client-visible message of err (the
// edge logs what the client does not see).
func (h *Handler) problem(r *http.Request, err error) (int, string) {
	e, status := h.edge.Problem(r.Context(), err)
	return status, e.Message
}

// Routes returns the patterns of the control plane and of the code
// interpreter, in registration order (without their catch-all "/"), so
// that tests can walk every route.
func (h *Handler) Routes() (control, jupyter []string) {
	return slices.Clone(h.control.patterns), slices.Clone(h.jupyter.patterns)
}

// mux is a ServeMux that remembers its patterns.
type mux struct {
	*http.ServeMux
	patterns []string
}

func newMux() *mux { return &mux{ServeMux: http.NewServeMux()} }

func (m *mux) Handle(pattern string, h http.Handler) {
	if pattern != "/" {
		m.patterns = append(m.patterns, pattern)
	}
	m.ServeMux.Handle(pattern, h)
}

func (m *mux) HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request)) {
	m.Handle(pattern, http.HandlerFunc(h))
}
