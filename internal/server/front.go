package server

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/apikey"
	"github.com/kiln-sh/kiln/internal/cluster"
	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/metrics"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/template"
	"github.com/kiln-sh/kiln/internal/volume"
)

// FrontOptions wire the API of a cluster front (kiln serve --role
// front): no sandboxes of its own, records and nodes from the catalog.
type FrontOptions struct {
	// Records are the catalog's sandbox and snapshot records, Nodes its
	// node registry and Keys its API keys: one shared store.
	Records sandbox.Store
	Nodes   cluster.Store
	Keys    apikey.Store
	// Templates and Volumes are the catalog's records of custom templates
	// and volumes: a create that uses one goes to its node.
	Templates template.Store
	Volumes   volume.Store
	Log       *slog.Logger
	// Config supplies limits, quotas, the cluster token and placement's
	// K.
	Config  config.Config
	Version string
	// Metrics, if set, records the front's requests and serves them with
	// the cluster's view of the catalog (cluster.Collector) at /metrics.
	Metrics *metrics.Metrics
	// Domain is the sandboxes' domain (E2B's <port>-<id>.<domain>): a
	// host under it that names no sandbox port is answered 404 here.
	Domain string
}

// front is what a Server of role front has instead of a Manager.
type front struct {
	store   sandbox.Store
	nodes   cluster.Store
	catalog *template.Catalog // records only: where a custom template lives
	volumes volume.Store
	dir     *cluster.Directory
	proxy   *cluster.Proxy
	stop    context.CancelFunc // ends the proxy's watch
	k       int
	routes  routes
	domain  string
	pools   cluster.PoolHints
}

// frontRecords are the catalog's sandbox records, as a front reads them.
type frontRecords struct{ st sandbox.Store }

func (c frontRecords) Get(ctx context.Context, id sandbox.ID) (sandbox.Sandbox, error) {
	return c.st.GetSandbox(ctx, id)
}

func (c frontRecords) List(ctx context.Context, f sandbox.Filter) ([]sandbox.Sandbox, string, error) {
	return c.st.ListSandboxes(ctx, f)
}

// quietNodes is how many heartbeat intervals a node may miss before a
// front refuses requests to it at once and cuts those in flight: a node
// that accepts connections but does not answer (stopped, cut off) fails
// them in about this long, not when the client gives up. Nodes are
// marked lost much later (KILN_NODE_LOST_AFTER).
const quietNodes = 3

// reserveTTL bounds how long a placement's reservation holds a slot if
// its front dies before releasing it.
const reserveTTL = 2 * time.Minute

// NewFront builds the API of a cluster front (docs/cluster.md): lists and
// gets from the catalog; creates placed on a live node (best of K, pinned
// to the node that holds their snapshot, template or volumes, another
// node when one refuses); every other request about one sandbox or
// volume proxied to its node; E2B's API likewise (front_e2b.go); the
// remaining routes (keys, templates, listings, MCP) to any live node.
func NewFront(o FrontOptions) *Server {
	s := New(Options{Keys: o.Keys, Log: o.Log, Config: o.Config, Version: o.Version, Nodes: o.Nodes, Metrics: o.Metrics})
	s.records = frontRecords{o.Records}
	hb := o.Config.Cluster.Heartbeat
	s.front = &front{
		store: o.Records, nodes: o.Nodes, dir: cluster.NewDirectory(o.Nodes, quietNodes*hb), k: o.Config.Cluster.PlacementK,
		catalog: &template.Catalog{Store: o.Templates}, volumes: o.Volumes,
		proxy: cluster.NewProxy(o.Config.Cluster.Token, s.log), domain: o.Domain,
	}
	var ctx context.Context
	ctx, s.front.stop = context.WithCancel(context.Background())
	go s.front.proxy.Watch(ctx, s.front.dir, max(hb/2, 100*time.Millisecond))
	s.mux, s.routes = http.NewServeMux(), nil
	s.registerFront()
	s.handler = s.edge.Handler(s.frontE2B(s.mux))
	return s
}

func (s *Server) registerFront() {
	s.route("GET /healthz", s.health, public)
	s.route("GET /metrics", s.serveMetrics, 0)
	s.route("GET /v1/node", s.frontNodeInfo, adminOnly)
	s.route("GET /v1/nodes", s.listNodes, adminOnly)
	s.route("POST /v1/sandboxes", s.frontCreate, 0)
	s.route("GET /v1/sandboxes", s.listSandboxes, 0)
	s.route("GET /v1/sandboxes/{id}", s.getSandbox, 0)
	s.route("DELETE /v1/sandboxes/{id}", s.frontSandbox, 0)
	s.route("/v1/sandboxes/{id}/", s.frontSandbox, streamBody)
	s.route("GET /v1/volumes/{id}", s.frontVolume, 0)
	s.route("DELETE /v1/volumes/{id}", s.frontVolume, 0)
	s.registerFrontTemplates()
	s.route("POST /mcp", s.frontMCP, 0)
	s.route("GET /mcp", s.frontMCP, 0)
	s.route("DELETE /mcp", s.frontMCP, 0)
	s.route("GET /console/", s.frontAny, public)
	s.route("/", s.frontAny, streamBody)
}

// frontSandbox proxies a request about one sandbox to its node. A
// sandbox that ended (killed, failed, or lost with its node) is answered
// here: its kill succeeds, anything else is failed_precondition with its
// reason.
func (s *Server) frontSandbox(w http.ResponseWriter, r *http.Request) error {
	id, err := pathID(r)
	if err != nil {
		return err
	}
	// A sandbox routed before, on a node that serves: no catalog read.
	if rt, ok := s.front.routes.get(id); ok && rt.owner == caller(r).ID {
		if n, err := s.front.dir.Node(r.Context(), rt.node); err == nil && n.Serving() && n.StartedAt.Equal(rt.started) {
			if err := s.front.dir.Answering(n); err != nil {
				return fmt.Errorf("sandbox %s: %w", id, err)
			}
			s.front.proxy.Forward(w, r, n, s.writeError)
			return nil
		}
	}
	sb, err := s.lookup(r)
	if err != nil {
		return err
	}
	if sb.State.Terminal() {
		if r.Method == http.MethodDelete && r.URL.Path == "/v1/sandboxes/"+sb.ID.String() {
			w.WriteHeader(http.StatusNoContent)
			return nil
		}
		return sb.Running()
	}
	n, err := s.liveNodeOf(r.Context(), sb) // front_move.go
	if err != nil {
		return err
	}
	s.front.routes.put(sb.ID, route{owner: sb.Owner, node: n.Name, started: n.StartedAt})
	s.front.proxy.Forward(w, r, n, s.writeError)
	return nil
}

// routedNode is the node of a sandbox this front routed before, if that
// node is serving, the same process and answering; errdefs.ErrNotFound
// otherwise.
func (s *Server) routedNode(ctx context.Context, id sandbox.ID) (cluster.Node, error) {
	if rt, ok := s.front.routes.get(id); ok {
		if n, err := s.front.dir.Node(ctx, rt.node); err == nil && n.StartedAt.Equal(rt.started) && s.front.dir.Answering(n) == nil {
			return n, nil
		}
	}
	return cluster.Node{}, fmt.Errorf("sandbox %s: no route: %w", id, errdefs.ErrNotFound)
}

// routes remembers the owner and node of the sandboxes a front routed.
// The owner never changes, and the node only when a paused sandbox is
// moved off a lost node (front_move.go): so a busy sandbox costs the
// catalog one read, not one per request; what does change (the sandbox
// ended, its node was lost or restarted, which a move needs first) is the
// node's to answer, or sends the front back to the catalog.
type routes struct {
	mu sync.Mutex
	m  map[sandbox.ID]route
}

type route struct {
	owner, node string
	started     time.Time // the node's start: a restarted node may have lost a moved sandbox
}

// maxRoutes bounds the routes remembered; on overflow they start afresh.
const maxRoutes = 100_000

func (rs *routes) get(id sandbox.ID) (route, bool) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rt, ok := rs.m[id]
	return rt, ok
}

func (rs *routes) put(id sandbox.ID, rt route) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.m == nil || len(rs.m) >= maxRoutes {
		rs.m = map[sandbox.ID]route{}
	}
	rs.m[id] = rt
}

// frontVolume proxies a request about one volume to the node that holds
// its files; a volume the catalog does not know goes to any node, which
// answers for it.
func (s *Server) frontVolume(w http.ResponseWriter, r *http.Request) error {
	return s.toVolumeNode(w, r, r.PathValue("id"), s.writeError)
}

// toVolumeNode proxies r, about owner's volume ref, to the volume's node.
func (s *Server) toVolumeNode(w http.ResponseWriter, r *http.Request, ref string, fail cluster.Fail) error {
	v, err := volume.Lookup(r.Context(), s.front.volumes, caller(r).ID, ref)
	if err != nil {
		return s.toAnyNode(w, r, fail)
	}
	return s.toNodeOf(w, r, v, fail)
}

// toNodeOf proxies r to the node that holds volume v.
func (s *Server) toNodeOf(w http.ResponseWriter, r *http.Request, v volume.Volume, fail cluster.Fail) error {
	n, err := s.front.dir.Node(r.Context(), v.Node)
	if err != nil {
		return fmt.Errorf("volume %s: its node %s: %w", v.Name, v.Node, err)
	}
	if err := s.front.dir.Answering(n); err != nil {
		return fmt.Errorf("volume %s: %w", v.Name, err)
	}
	s.front.proxy.Forward(w, r, n, fail)
	return nil
}

// frontAny proxies a request about no one sandbox to a live node.
func (s *Server) frontAny(w http.ResponseWriter, r *http.Request) error {
	return s.toAnyNode(w, r, s.writeError)
}

// toAnyNode proxies r to a live node chosen at random.
func (s *Server) toAnyNode(w http.ResponseWriter, r *http.Request, fail cluster.Fail) error {
	ns, err := s.front.dir.Nodes(r.Context())
	if err != nil {
		return err
	}
	var live []cluster.Node
	for _, n := range ns {
		if n.State == cluster.NodeLive && s.front.dir.Answering(n) == nil {
			live = append(live, n)
		}
	}
	if len(live) == 0 {
		return fmt.Errorf("no live node: %w", errdefs.ErrUnavailable)
	}
	s.front.proxy.Forward(w, r, live[rand.IntN(len(live))], fail)
	return nil
}

// maxRefusalBytes bounds the body of a node's refusal kept to answer
// with when every node refused.
const maxRefusalBytes = 64 << 10

// frontCreate validates a create as a node would, then offers it to the
// live nodes in placement order: each is first reserved a slot in the
// catalog (so concurrent fronts never overfill a node), then sent the
// request; a node that refuses for capacity (429, 503) or does not
// answer is passed over for the next. The first other answer is the
// client's.
func (s *Server) frontCreate(w http.ResponseWriter, r *http.Request) error {
	var body bytes.Buffer
	var req api.CreateSandboxRequest
	limited := http.MaxBytesReader(w, r.Body, maxJSONBytes)
	if err := decodeBody(io.TeeReader(limited, &body), &req); err != nil {
		return err
	}
	if _, err := io.Copy(&body, limited); err != nil {
		return fmt.Errorf("reading the request: %w", err)
	}
	if _, err := s.createOptions(caller(r), req); err != nil {
		return err
	}
	switch req.Runtime {
	case "", "runsc", "runc":
	default:
		return invalid("runtime %q: want runsc or runc", errdefs.ClipN(req.Runtime, 32))
	}
	want, err := s.frontWant(r.Context(), caller(r).ID, req.Runtime, req.Template, req.Snapshot, req.Volumes)
	if err != nil {
		return err
	}
	if pooled(req) {
		want.Pool = cluster.PoolName(cmp.Or(req.Template, "base"))
	}
	return s.place(w, r, body.Bytes(), want, s.reservation(caller(r), req.Limits.MemoryBytes))
}

// pooled reports whether a pooled sandbox could serve req, as far as a
// front can tell (the node decides): the template's defaults and the
// node's default runtime, no snapshot, volumes or network mode.
func pooled(req api.CreateSandboxRequest) bool {
	return req.Runtime == "" && req.Limits == (api.Limits{}) && req.Snapshot == "" && len(req.Volumes) == 0 &&
		(req.Network == nil || req.Network.Mode == "")
}

// reservation is what a create by k asks of the catalog besides a slot:
// k's quota, held across the cluster, and the create's memory (memory 0
// takes the default limit).
func (s *Server) reservation(k apikey.Key, memory int64) cluster.Reservation {
	if memory == 0 {
		memory = s.cfg.Limits.DefaultMemoryBytes
	}
	q := s.quota(k)
	return cluster.Reservation{Owner: k.ID, MemoryBytes: memory, MaxSandboxes: q.MaxSandboxes, MaxMemoryBytes: q.MaxMemoryBytes}
}

// frontWant is where a create may go: a node with the runtime, and the
// one node that holds what it starts from (its snapshot, or a custom
// template not in the cluster registry) and its volumes, if it names
// any; a custom template in the cluster registry prefers the nodes that
// hold it. What the catalog does not know is left to the node to refuse.
func (s *Server) frontWant(ctx context.Context, owner, runtime, tmpl, snapshot string, vols []api.VolumeMount) (cluster.Want, error) {
	want := cluster.Want{Runtime: runtime}
	pin := func(node, what string) error {
		switch {
		case node == "" || node == want.Node:
		case want.Node == "":
			want.Node = node
		default:
			return invalid("%s is on node %s, and the rest of the sandbox on node %s: they cannot meet", what, node, want.Node)
		}
		return nil
	}
	if snapshot != "" {
		// One in the shared snapshot dir goes to any node, its own first.
		if snap, err := s.front.store.GetSnapshot(ctx, owner, snapshot); err == nil && snap.Image != "" {
			want.Prefer = snap.Node
		} else if err == nil {
			want.Node = snap.Node
		}
	}
	if tmpl != "" && want.Node == "" {
		where, err := s.front.catalog.Where(ctx, owner, tmpl)
		if err != nil && !errors.Is(err, errdefs.ErrInvalidArgument) {
			return want, err
		}
		// A build in the cluster registry goes anywhere, best where it
		// is already; one that is not, only where it was built.
		if where.Image != "" {
			want.Build = where.Build
		} else {
			want.Node = where.Node
		}
	}
	for _, m := range vols {
		if v, err := volume.Lookup(ctx, s.front.volumes, owner, m.Volume); err == nil {
			if err := pin(v.Node, "volume "+v.Name); err != nil {
				return want, err
			}
		}
	}
	return want, nil
}

// place offers a create (r with body) to the live nodes that fit want,
// in placement order, reserving res on each, and writes the first answer
// that is not a refusal. A reservation over the owner's quota ends it.
func (s *Server) place(w http.ResponseWriter, r *http.Request, body []byte, want cluster.Want, res cluster.Reservation) error {
	nodes, err := s.front.nodes.Nodes(r.Context())
	if err != nil {
		return fmt.Errorf("reading the node registry: %w", err)
	}
	// A live node that stopped heartbeating (frozen, cut off) would hold
	// the create until the client gives up. (The directory's listing, at
	// most a second old, says whether the catalog takes heartbeats.)
	if _, err := s.front.dir.Nodes(r.Context()); err != nil {
		return err
	}
	nodes = slices.DeleteFunc(nodes, func(n cluster.Node) bool {
		return n.State == cluster.NodeLive && s.front.dir.Answering(n) != nil
	})
	order, err := s.front.pools.Place(nodes, want, s.front.k)
	if err != nil {
		return fmt.Errorf("placing the sandbox: %w", err)
	}
	var (
		refusal *http.Response
		last    error
	)
	for _, n := range order {
		res.Node = n.Name
		resp, err := s.offer(r, body, n, res)
		switch {
		case r.Context().Err() != nil:
			return r.Context().Err() // the client went away
		case errors.Is(err, cluster.ErrOverQuota):
			return fmt.Errorf("creating sandbox: %w", err)
		case err != nil && (errors.Is(err, errReserving) || errors.Is(err, cluster.ErrNotDelivered)):
			s.log.Info("create passed over a node", "node", n.Name, "err", err)
			last = err
			continue
		case err != nil:
			// It reached the node, which may have made the sandbox:
			// another node would make a second one.
			return fmt.Errorf("creating the sandbox: %w", err)
		}
		if resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode != http.StatusServiceUnavailable {
			return cluster.CopyResponse(w, resp)
		}
		s.log.Info("create refused by a node; trying another", "node", n.Name, "status", resp.StatusCode)
		refusal = keepRefusal(resp)
	}
	if refusal != nil {
		return cluster.CopyResponse(w, refusal)
	}
	return fmt.Errorf("placing the sandbox: no node took it (%d tried; the last: %w)", len(order), last)
}

// errReserving marks a create that got no slot on a node (full, lost,
// or its owner over quota): it was not sent there.
var errReserving = errors.New("reserving a slot")

// offer reserves res (a slot on node n) and sends n the create. The
// sandbox's record takes the reservation's place when the node writes it
// (the store does that); a create that did not succeed releases it.
func (s *Server) offer(r *http.Request, body []byte, n cluster.Node, res cluster.Reservation) (*http.Response, error) {
	id, err := s.front.nodes.Reserve(r.Context(), res, reserveTTL)
	if errors.Is(err, cluster.ErrOverQuota) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errReserving, err)
	}
	resp, err := s.front.proxy.Send(r.Context(), r, body, n)
	if err != nil || resp.StatusCode >= 300 {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 10*time.Second)
		defer cancel()
		if err := s.front.nodes.Release(ctx, id); err != nil {
			s.log.Warn("releasing a placement", "node", res.Node, "err", err)
		}
	}
	return resp, err
}

// keepRefusal reads a bounded copy of a node's refusal and closes it.
func keepRefusal(resp *http.Response) *http.Response {
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxRefusalBytes))
	out := *resp
	out.Header = resp.Header.Clone()
	out.Header.Del("Content-Length")
	out.Body = io.NopCloser(bytes.NewReader(b))
	return &out
}

// CloseFront drops the front's idle connections to nodes.
func (s *Server) CloseFront() {
	if s.front != nil {
		s.front.stop()
		s.front.proxy.Close()
	}
}
