// Package server is Kiln's HTTP API: the REST routes of api/openapi.yaml on
// a stdlib ServeMux behind the HTTP edge (internal/edge: request ids and
// logs, API-key auth, admission, error statuses), tenancy, NDJSON and
// WebSocket streams, and E2B's API mounted on the same handler. Handlers decode,
// call sandbox.Manager or a sandbox's Agent, and encode; they never touch
// the host's file system.
package server

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"net/http"
	"runtime/debug"
	"sync"
	"time"

	"github.com/kiln-sh/kiln/internal/apikey"
	"github.com/kiln-sh/kiln/internal/cluster"
	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/console"
	"github.com/kiln-sh/kiln/internal/e2b"
	"github.com/kiln-sh/kiln/internal/edge"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/metrics"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/template"
	"github.com/kiln-sh/kiln/internal/template/builder"
	"github.com/kiln-sh/kiln/internal/tools"
	"github.com/kiln-sh/kiln/internal/volume"
)

// Options wire a Server.
type Options struct {
	Manager *sandbox.Manager
	Keys    apikey.Store
	Log     *slog.Logger
	// Metrics may be nil: then nothing is recorded and GET /metrics is
	// 404.
	Metrics *metrics.Metrics
	// Config supplies limits and per-key quota defaults; zero fields take
	// config.Default().
	Config  config.Config
	Version string
	// KeyCacheTTL bounds how long a key lookup is reused, hence how long a
	// revocation on another node takes to bite (default 1s; negative
	// disables the cache).
	KeyCacheTTL time.Duration
	// PingInterval is the silence after which streams send a ping event
	// (default 15s).
	PingInterval time.Duration
	// Images serves snapshots and forks: the Manager's Images.
	Images *sandbox.Images
	// E2B, if set, also serves E2B's API on the same handler (see
	// mountE2B); Manager, Images, Log and Edge are filled in here.
	E2B *e2b.Options
	// Builder, Templates (its records) and Catalog (the Manager's) serve
	// /v1/templates; without them those routes answer unavailable.
	Builder   *builder.Builder
	Templates template.Store
	Catalog   *template.Catalog
	// Volumes serves /v1/volumes (and E2B's volume API); without it those
	// routes answer unavailable.
	Volumes *volume.Manager
	// ClusterToken, if set, makes this the API of a cluster node: every
	// request must carry it (cluster.TokenHeader), as fronts send it.
	ClusterToken string
	// Nodes is the catalog's node registry, served at GET /v1/nodes;
	// without it that route answers unavailable.
	Nodes cluster.Store
	// Node is a cluster node's name and Cluster an in-process front of
	// its cluster (NewFront): MCP sessions made here then have ids that
	// name this node, so that fronts route them here, and call the
	// cluster through that front, so that their sandboxes are placed (and
	// reached) as any other (tools.go).
	Node    string
	Cluster *Server
}

// records reads sandbox records: a Manager's (live ones first, then its
// store), or on a front the catalog's (front.go).
type records interface {
	Get(ctx context.Context, id sandbox.ID) (sandbox.Sandbox, error)
	List(ctx context.Context, f sandbox.Filter) ([]sandbox.Sandbox, string, error)
}

var _ records = (*sandbox.Manager)(nil)

// Server serves the API. It is an http.Handler; Shutdown drains its
// streams.
type Server struct {
	m       *sandbox.Manager // nil on a front
	records records
	front   *front // on a front only (front.go)
	im      *sandbox.Images
	keys    *keyCache
	log     *slog.Logger
	metrics *metrics.Metrics
	cfg     config.Config
	version string
	ping    time.Duration

	mux     *http.ServeMux
	handler http.Handler
	edge    *edge.Edge
	routes  []string
	mcp     *tools.HTTPHandler // /mcp (tools.go)
	node    string             // a cluster node's name (Options.Node)
	cluster *Server            // what MCP sessions call (Options.Cluster)
	e2b     *e2b.Handler       // E2B's API, if mounted (e2b.go)

	nodes   cluster.Store    // GET /v1/nodes (node.go)
	builder *builder.Builder // templates*.go
	tmpl    template.Store
	catalog *template.Catalog
	volumes *volume.Manager // volumes.go

	// streams are the in-flight streaming responses; drain is cancelled
	// when Shutdown's grace period is over.
	streams     sync.WaitGroup
	drain       context.Context
	cancelDrain context.CancelFunc
}

// New builds the API's handler.
func New(o Options) *Server {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Config.Server.DefaultMaxSandboxes == 0 {
		o.Config.Server = config.Default().Server
	}
	if o.Config.Limits.MaxCommandTimeout == 0 {
		o.Config.Limits = config.Default().Limits
	}
	if o.KeyCacheTTL == 0 {
		o.KeyCacheTTL = time.Second
	}
	if o.PingInterval <= 0 {
		o.PingInterval = 15 * time.Second
	}
	s := &Server{
		m: o.Manager, im: o.Images, keys: newKeyCache(o.Keys, o.KeyCacheTTL), log: o.Log.With("component", "server"),
		metrics: o.Metrics, cfg: o.Config, version: o.Version, ping: o.PingInterval,
		mux:     http.NewServeMux(),
		builder: o.Builder, tmpl: o.Templates, catalog: o.Catalog, volumes: o.Volumes, nodes: o.Nodes,
		node: o.Node, cluster: o.Cluster,
	}
	s.edge = edge.New(edge.Options{
		Log: s.log, Keys: s.keys, Metrics: o.Metrics, Config: o.Config.Server.Edge,
		DefaultQuota: sandbox.Quota{MaxSandboxes: o.Config.Server.DefaultMaxSandboxes, MaxMemoryBytes: o.Config.Server.DefaultMaxMemoryBytes},
		Scrub:        []string{o.Config.DataDir, o.Config.RunDir},
	})
	s.records = o.Manager
	s.drain, s.cancelDrain = context.WithCancel(context.Background())
	s.register()
	if o.ClusterToken != "" {
		s.route("GET /v1/cluster/signer/{op}", s.signer, public) // fronts' (front_signed.go)
	}
	s.handler = s.edge.Handler(s.clusterGuard(o.ClusterToken, s.mountE2B(o.E2B, o.Log, s.mux)))
	return s
}

// clusterGuard refuses, on a cluster node (token set), every request
// without the cluster token, and takes the token off the requests it
// lets through so that nothing downstream (an exposed port's proxy into
// a sandbox) ever sees it.
func (s *Server) clusterGuard(token string, next http.Handler) http.Handler {
	if token == "" {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !cluster.TokenOK(r, token) {
			s.writeError(w, r, fmt.Errorf("this is a cluster node: use a front (requests need the cluster token): %w", errdefs.ErrUnauthenticated))
			return
		}
		r.Header.Del(cluster.TokenHeader)
		// A front's keep-alive connections are never a slow client's.
		s.edge.TrustConn(r)
		// One id for the front's log line and the node's.
		edge.AdoptRequestID(w, r, r.Header.Get(cluster.RequestIDHeader))
		r.Header.Del(cluster.RequestIDHeader)
		next.ServeHTTP(w, r)
	})
}

// ServeHTTP serves one request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

// HTTPServer returns the http.Server to serve s with: the edge's header
// and idle timeouts, bound on header size and cap on pending connections
// (edge.HTTPServer). errLog may be nil.
func (s *Server) HTTPServer(errLog *log.Logger) *http.Server { return s.edge.HTTPServer(s, errLog) }

// Routes returns the registered "METHOD /pattern" strings, in
// registration order.
func Routes() []string { return New(Options{}).routes }

// register names every route. Keep in step with api/openapi.yaml.
func (s *Server) register() {
	s.route("GET /healthz", s.health, public)
	s.route("GET /metrics", s.serveMetrics, 0)
	s.route("GET /v1/node", s.nodeInfo, adminOnly)
	s.route("GET /v1/nodes", s.listNodes, adminOnly)

	s.route("POST /v1/sandboxes", s.createSandbox, 0)
	s.route("GET /v1/sandboxes", s.listSandboxes, 0)
	s.route("GET /v1/sandboxes/{id}", s.getSandbox, 0)
	s.route("DELETE /v1/sandboxes/{id}", s.killSandbox, 0)
	s.route("POST /v1/sandboxes/{id}/timeout", s.setTimeout, 0)
	s.route("GET /v1/sandboxes/{id}/usage", s.usage, 0)
	s.route("POST /v1/sandboxes/{id}/pause", s.pauseSandbox, 0)
	s.route("POST /v1/sandboxes/{id}/resume", s.resumeSandbox, 0)
	s.route("POST /v1/sandboxes/{id}/fork", s.forkSandbox, 0)
	s.route("POST /v1/sandboxes/{id}/snapshots", s.createSnapshot, 0)
	s.route("GET /v1/snapshots", s.listSnapshots, 0)
	s.route("GET /v1/snapshots/{name}", s.getSnapshot, 0)
	s.route("DELETE /v1/snapshots/{name}", s.deleteSnapshot, 0)
	s.route("GET /v1/sandboxes/{id}/network", s.getNetwork, 0)
	s.route("PUT /v1/sandboxes/{id}/network", s.setNetwork, 0)
	s.route("GET /v1/sandboxes/{id}/network/usage", s.networkUsage, 0)

	s.route("POST /v1/sandboxes/{id}/commands", s.runCommand, 0)
	s.route("GET /v1/sandboxes/{id}/commands", s.listCommands, 0)
	s.route("GET /v1/sandboxes/{id}/commands/{pid}/events", s.commandEvents, 0)
	s.route("POST /v1/sandboxes/{id}/commands/{pid}/stdin", s.commandStdin, streamBody)
	s.route("POST /v1/sandboxes/{id}/commands/{pid}/signal", s.signalCommand, 0)
	s.route("POST /v1/sandboxes/{id}/commands/{pid}/resize", s.resizeCommand, 0)

	s.route("POST /v1/sandboxes/{id}/code", s.runCode, 0)
	s.route("POST /v1/sandboxes/{id}/contexts", s.createContext, 0)
	s.route("GET /v1/sandboxes/{id}/contexts", s.listContexts, 0)
	s.route("POST /v1/sandboxes/{id}/contexts/{ctx}/restart", s.restartContext, 0)
	s.route("DELETE /v1/sandboxes/{id}/contexts/{ctx}", s.deleteContext, 0)

	s.route("GET /v1/sandboxes/{id}/files", s.readFile, 0)
	s.route("PUT /v1/sandboxes/{id}/files", s.writeFile, 0)
	s.route("POST /v1/sandboxes/{id}/files", s.uploadFiles, 0)
	s.route("DELETE /v1/sandboxes/{id}/files", s.removeFile, 0)
	s.route("GET /v1/sandboxes/{id}/files/list", s.listFiles, 0)
	s.route("GET /v1/sandboxes/{id}/files/stat", s.statFile, 0)
	s.route("POST /v1/sandboxes/{id}/files/mkdir", s.mkdir, 0)
	s.route("POST /v1/sandboxes/{id}/files/move", s.moveFile, 0)
	s.route("GET /v1/sandboxes/{id}/files/watch", s.watchFiles, 0)

	s.route("GET /v1/sandboxes/{id}/screenshot", s.screenshot, 0)

	s.route("GET /v1/tools", s.listTools, 0)
	s.route("POST /v1/sandboxes/{id}/tools/{name}", s.callTool, 0)
	s.mcp = s.newMCP()
	s.route("POST /mcp", s.serveMCP, 0)
	s.route("GET /mcp", s.serveMCP, 0)
	s.route("DELETE /mcp", s.serveMCP, 0)

	s.route("HEAD /v1/templates/files/{hash}", s.headFiles, 0)
	s.route("PUT /v1/templates/files/{hash}", s.putFiles, streamBody)
	s.route("POST /v1/templates/builds", s.startBuild, 0)
	s.route("GET /v1/templates/builds", s.listBuilds, 0)
	s.route("GET /v1/templates/builds/{id}", s.getBuild, 0)
	s.route("GET /v1/templates/builds/{id}/logs", s.buildLogs, 0)
	s.route("GET /v1/templates", s.listTemplates, 0)
	s.route("GET /v1/templates/{ref}", s.getTemplate, 0)
	s.route("DELETE /v1/templates/{ref}", s.deleteTemplate, 0)
	s.route("POST /v1/templates/{ref}/push", s.pushTemplate, 0)
	s.route("PATCH /v1/templates/{name}", s.setTemplatePublic, 0)
	s.route("PUT /v1/templates/{name}/tags/{tag}", s.tagTemplate, 0)
	s.route("DELETE /v1/templates/{name}/tags/{tag}", s.untagTemplate, 0)

	s.route("POST /v1/volumes", s.createVolume, 0)
	s.route("GET /v1/volumes", s.listVolumes, 0)
	s.route("GET /v1/volumes/{id}", s.getVolume, 0)
	s.route("DELETE /v1/volumes/{id}", s.deleteVolume, 0)

	s.route("GET /v1/keys", s.listKeys, adminOnly)
	s.route("POST /v1/keys", s.createKey, adminOnly)
	s.route("DELETE /v1/keys/{id}", s.revokeKey, adminOnly)

	// The web console's files (internal/console); its pages call the
	// routes above with the key the user signs in with.
	s.mux.Handle("GET "+console.Prefix, s.adapt(console.Serve, public))

	// Everything else answers with an api.Error too (a browser's GET / is
	// sent to the console).
	s.mux.Handle("/", s.adapt(console.Root(s.notFound), public))
}

// routeFlags say who may call a route.
type routeFlags int

const (
	public     routeFlags = 1 << iota // no API key needed (capped: Edge.MaxAnonymous)
	adminOnly                         // admin keys only
	streamBody                        // the body is a stream: an idle deadline only
)

// handlerFunc is a handler that returns its error for ServeHTTP to write.
type handlerFunc func(w http.ResponseWriter, r *http.Request) error

func (s *Server) route(pattern string, h handlerFunc, f routeFlags) {
	s.routes = append(s.routes, pattern)
	s.mux.Handle(pattern, s.adapt(h, f))
}

// adapt authenticates (or admits a public request), runs h and writes
// its error. Nothing reads the body before.
func (s *Server) adapt(h handlerFunc, f routeFlags) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer s.recover(w, r)
		if f&streamBody != 0 {
			edge.StreamBody(r)
		}
		err := s.authenticate(r, f)
		if f&public != 0 {
			if err = s.edge.Admit(r, false); err != nil {
				w.Header().Set("Connection", "close")
			}
		}
		if err == nil {
			err = h(w, r)
		}
		if err != nil {
			s.writeError(w, r, err)
		}
	})
}

// recover turns a handler's panic into an internal error; a deliberate
// http.ErrAbortHandler passes through.
func (s *Server) recover(w http.ResponseWriter, r *http.Request) {
	v := recover()
	if v == nil {
		return
	}
	if v == http.ErrAbortHandler {
		panic(v)
	}
	s.writeError(w, r, fmt.Errorf("handler panic: %v\n%s", v, debug.Stack()))
}

// Shutdown waits for in-flight streams to end until ctx is done, then
// cancels them and waits a little for their handlers to return. Call it
// after http.Server.Shutdown began refusing new connections; hijacked
// WebSocket streams are invisible to http.Server, so this is what drains
// them.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mcp.Close() // MCP sessions cannot outlive the process: kill their sandboxes
	done := make(chan struct{})
	go func() { s.streams.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	}
	s.cancelDrain()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
	}
	return ctx.Err()
}
