package e2b

import (
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kiln-sh/kiln/internal/e2b/envd"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// Options wire a Handler. internal/server fills in Manager, Images, Log and the
// hooks; kiln serve supplies Secret (and the networking code PortProxy).
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
	// Authenticate resolves a request's API key (X-API-KEY, or
	// Authorization: Bearer) into the caller (the server's key handling);
	// an error is answered as is. The data plane uses it too: an API key
	// of a sandbox's owner opens its ports like the access token.
	Authenticate func(r *http.Request) (Caller, error)
	// Admit tells the server how a data-plane request was authorized:
	// by a credential for its sandbox (a token, a URL signature or an
	// API key), or by none (health probes, public ports). The server caps
	// how many of the latter run at once; its error (resource exhausted)
	// is answered 429. nil admits all.
	Admit func(r *http.Request, credentialed bool) error
	// Problem is the server's one mapping of errors to an HTTP status
	// and the message a client may see.
	Problem func(r *http.Request, err error) (status int, message string)
	// Annotate tells the server's request log which sandbox a request
	// was about.
	Annotate func(r *http.Request, sandboxID string)
	// ObserveCreate records how long a sandbox create took and how it
	// ended, in the server's metrics.
	ObserveCreate func(d time.Duration, err error)
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
	dying    sync.Map // sandbox.ID → struct{}
	problem  func(r *http.Request, err error) (int, string)
	annotate func(r *http.Request, sandboxID string)
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
		usage: newCPUSampler(), problem: o.Problem, annotate: o.Annotate,
	}
	if h.problem == nil {
		h.problem = defaultProblem
	}
	if h.annotate == nil {
		h.annotate = func(*http.Request, string) {}
	}
	if h.o.Admit == nil {
		h.o.Admit = func(*http.Request, bool) error { return nil }
	}
	if h.o.ObserveCreate == nil {
		h.o.ObserveCreate = func(time.Duration, error) {}
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
	if signedFiles(r) {
		return true
	}
	p := r.URL.Path
	if p == "/health" {
		return true
	}
	for _, prefix := range []string{"/sandboxes", "/v2/", "/v3/", "/templates", "/snapshots"} {
		if p == prefix || strings.HasPrefix(p, prefix+"/") || (strings.HasSuffix(prefix, "/") && strings.HasPrefix(p, prefix)) {
			return true
		}
	}
	return false
}

// ServeHTTP serves a request Routed picked.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Header.Get(headerSandboxID) != "" || r.Header.Get(headerSandboxPort) != "":
		h.serveHeaderRouted(w, r)
	case signedFiles(r):
		h.serveSignedFiles(w, r)
	default:
		if port, id, ok := hostTarget(r.Host); ok {
			h.serveData(w, r, id, port)
			return
		}
		h.control.ServeHTTP(w, r)
	}
}

// defaultProblem is used when no server supplies its error mapping:
// everything is an internal error.
func defaultProblem(_ *http.Request, err error) (int, string) {
	return http.StatusInternalServerError, err.Error()
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
