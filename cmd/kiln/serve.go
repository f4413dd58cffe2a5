package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/apikey"
	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/e2b"
	"github.com/kiln-sh/kiln/internal/metrics"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/server"
	"github.com/kiln-sh/kiln/internal/store"
	"github.com/kiln-sh/kiln/internal/template"
	"github.com/kiln-sh/kiln/internal/template/builder"
	"github.com/kiln-sh/kiln/internal/template/image"
	"github.com/kiln-sh/kiln/internal/template/layer"
	"github.com/kiln-sh/kiln/internal/volume"
)

const serveUsage = `Usage:
  kiln serve [flags]

Serves the REST API. Sandboxes outlive the server: a restarted server
re-adopts them. On the first start with an empty store it prints an admin
API key once. Logs are JSON on stderr.

With --role node (sandbox hosts) and --role front (the API, no sandboxes)
several kiln serve processes share one PostgreSQL store as one Kiln; see
docs/cluster.md.

Flags (environment in parentheses):
`

func serveCmd(ctx context.Context, cfg config.Config, args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), serveUsage); fs.PrintDefaults() }
	fs.StringVar(&cfg.Server.Listen, "listen", cfg.Server.Listen, "address to serve the API on (KILN_LISTEN)")
	fs.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "data directory: templates, sandboxes, sqlite store (KILN_DATA_DIR)")
	fs.StringVar(&cfg.Server.Store, "store", cfg.Server.Store, `"sqlite" (DATA_DIR/kiln.db), "sqlite:/abs/path" or "postgres://…" (KILN_STORE)`)
	fs.StringVar(&cfg.Runtime, "runtime", cfg.Runtime, "default runtime: runsc or runc (KILN_RUNTIME)")
	fs.DurationVar(&cfg.Server.ShutdownGrace, "shutdown-grace", cfg.Server.ShutdownGrace, "how long streams may run on after SIGTERM (KILN_SHUTDOWN_GRACE)")
	if cfg.Server.Pools == nil {
		cfg.Server.Pools = config.Pools{}
	}
	fs.Var(cfg.Server.Pools, "pool", `ready sandboxes kept per template (name or name:tag), e.g. "code-interpreter=2,base=4,site:v2=1" (KILN_POOL)`)
	if cfg.Server.PoolBursts == nil {
		cfg.Server.PoolBursts = config.Pools{}
	}
	fs.Var(cfg.Server.PoolBursts, "pool-burst", `most ready sandboxes demand may grow a pool to, e.g. "base=16": the pool keeps as many as creates asked it for in the last minute, at least its --pool size (KILN_POOL_BURST; docs/pools.md)`)
	fs.Var(networkFlag{&cfg.Network.Setup}, "network",
		`sandbox networking (NAT, egress policy, DNS): "auto" where the host can, "on" (fail if it cannot) or "off"; a bare --network is on (KILN_NETWORK)`)
	fs.StringVar(&cfg.Network.DefaultMode, "network-default", cfg.Network.DefaultMode,
		`network of sandboxes that do not ask: "none" or "nat" (KILN_NETWORK_DEFAULT; default nat when networking is up)`)
	cfg.Server.Builds = cfg.Server.Builds.WithDefaults()
	b := &cfg.Server.Builds
	fs.DurationVar(&b.Timeout, "build-timeout", b.Timeout, "longest a template build may run (KILN_BUILD_TIMEOUT)")
	fs.Var(bytesFlag{&b.MaxContextBytes}, "build-max-context", "largest upload of build files, e.g. 1G (KILN_BUILD_MAX_CONTEXT)")
	fs.Var(bytesFlag{&b.MaxLayerBytes}, "build-max-layer", "most one build step may write, e.g. 10G (KILN_BUILD_MAX_LAYER)")
	fs.IntVar(&b.MaxPerKey, "max-builds-per-key", b.MaxPerKey, "template builds one API key may run at once (KILN_MAX_BUILDS_PER_KEY)")
	fs.IntVar(&b.MaxConcurrent, "max-builds", b.MaxConcurrent, "template builds the server runs at once (KILN_MAX_BUILDS)")
	fs.BoolVar(&b.LoopbackRegistries, "build-loopback-registries", b.LoopbackRegistries,
		"let builds pull images from registries on this host's loopback (KILN_BUILD_LOOPBACK_REGISTRIES=1)")
	pub := &cfg.Server.Public
	fs.StringVar(&pub.Domain, "domain", pub.Domain,
		`sandboxes' domain: E2B's sandbox.getHost(port) is PORT-ID.DOMAIN, served here (KILN_DOMAIN; default localhost:LISTEN_PORT)`)
	fs.StringVar(&pub.TLSCert, "tls-cert", pub.TLSCert, "PEM certificate: serve HTTPS only, for the API and *.DOMAIN (KILN_TLS_CERT)")
	fs.StringVar(&pub.TLSKey, "tls-key", pub.TLSKey, "PEM private key of --tls-cert (KILN_TLS_KEY)")
	fs.Var(bytesFlag{&cfg.Server.VolumeMaxBytes}, "volume-max-size", "largest volume, e.g. 64G (default 64G)")
	fs.Var(bytesFlag{&cfg.Server.VolumeQuotaBytes}, "volume-quota", "most one API key's volumes may hold together, e.g. 16G (default 16G)")
	cl := &cfg.Cluster
	fs.StringVar(&cl.Role, "role", cl.Role, `"all" (API and sandboxes: one machine), "node" (sandboxes, for fronts) or "front" (API, placement, routing) (KILN_ROLE; docs/cluster.md)`)
	fs.StringVar(&cl.NodeName, "node-name", cl.NodeName, "this node's name in the catalog (KILN_NODE_NAME; default the hostname)")
	fs.StringVar(&cl.Token, "cluster-token", cl.Token, "shared secret between fronts and nodes, 32+ characters (KILN_CLUSTER_TOKEN; prefer the environment)")
	fs.StringVar(&cl.AdvertiseURL, "advertise-url", cl.AdvertiseURL, "URL fronts reach this node at (KILN_ADVERTISE_URL; default http://LISTEN)")
	fs.IntVar(&cl.Slots, "node-slots", cl.Slots, "sandboxes this node takes (KILN_NODE_SLOTS)")
	fs.StringVar(&cl.Registry, "cluster-registry", cl.Registry,
		`OCI registry and repository prefix where nodes keep custom template builds for each other, e.g. "registry.internal/kiln" (KILN_CLUSTER_REGISTRY)`)
	fs.StringVar(&cl.SnapshotDir, "snapshot-dir", cl.SnapshotDir,
		"directory shared by every node (e.g. NFS) for paused sandboxes' and snapshots' images, so any node restores them (KILN_SNAPSHOT_DIR)")
	fs.DurationVar(&cl.DrainTimeout, "drain-timeout", cl.DrainTimeout,
		"how long a node waits on SIGTERM, draining, for its sandboxes to end; 0: exit at once (KILN_DRAIN_TIMEOUT)")
	if cl.Pools == nil {
		cl.Pools = config.ClusterPools{}
	}
	fs.Var(cl.Pools, "cluster-pool", `ready sandboxes per template across the cluster's live nodes, each node keeping its share rounded up, e.g. "code-interpreter=6" (KILN_CLUSTER_POOL; nodes only; docs/pools.md)`)
	debug := fs.Bool("debug", false, "log at debug level")
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 {
		return exitError{2}
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	level := slog.LevelInfo
	if *debug {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if err := raiseNofile(); err != nil {
		log.Warn("cannot raise the open files limit", "err", err)
	}
	return serve(ctx, cfg, log)
}

// serve runs the API until ctx is done, then drains it.
func serve(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	st, err := store.Open(ctx, cfg.Server.Store, cfg.DataDir)
	if err != nil {
		return err
	}
	defer st.Close()
	if cfg.Cluster.Role == config.RoleFront {
		return serveFront(ctx, cfg, st, log)
	}
	nodeName := ""
	// A node drains on SIGTERM: stopping ends then, and ctx (the node's
	// API, heartbeat and sandboxes) only once the drain is over.
	stopping, drained := ctx, func() {}
	if cfg.Cluster.Role == config.RoleNode {
		if nodeName, err = clusterNodeName(cfg.Cluster); err != nil {
			return err
		}
		var stop context.CancelFunc
		ctx, stop = context.WithCancel(context.WithoutCancel(ctx))
		defer stop()
		drained = stop
	}
	nw, err := openNetwork(ctx, cfg, log.With("component", "network"))
	if err != nil {
		return err
	}
	if nw != nil {
		defer nw.Close()
	}
	catalog := &template.Catalog{DataDir: cfg.DataDir, Store: st}
	vols, err := volume.New(volume.Config{
		Dir: filepath.Join(cfg.DataDir, "volumes"), Store: st, Node: nodeName,
		MaxSize: cfg.Server.VolumeMaxBytes, Quota: cfg.Server.VolumeQuotaBytes, Log: log.With("component", "volumes"),
	})
	if err != nil {
		return err
	}
	m, err := sandbox.NewManager(ctx, sandbox.Config{
		Config: cfg, StateDir: filepath.Join(cfg.DataDir, "sandboxes"), Adopt: true, Store: st, Net: nw,
		Catalog: catalog, Volumes: vols, Node: nodeName,
	}, runtimes(ctx, cfg), log.With("component", "manager"))
	if err != nil {
		return err
	}
	// Sandboxes keep running: the next start re-adopts them.
	defer m.Close()
	im, err := sandbox.NewImages(ctx, m)
	if err != nil {
		return err
	}
	// Warm checkpoints missing (e.g. after an upgrade of kiln or runsc) are
	// built in the background; pools fill once their template's is there.
	im.SetPoolBursts(cfg.Server.PoolBursts)
	warmed := make(chan struct{})
	go func() {
		defer close(warmed)
		im.WarmTemplates(ctx)
		// With pools sized across a cluster, the node's heartbeat loop
		// sizes and starts them (cluster.Member).
		if len(cfg.Server.Pools) > 0 && len(cfg.Cluster.Pools) == 0 && ctx.Err() == nil {
			im.StartPools(cfg.Server.Pools)
		}
	}()
	defer func() { <-warmed }()
	ln, err := listenAPI(ctx, cfg, st)
	if err != nil {
		return err
	}
	domain := sandboxDomain(cfg.Server.Public, ln.Addr())
	secret, err := e2b.LoadSecret(filepath.Join(cfg.DataDir, "e2b.secret"))
	if err != nil {
		ln.Close()
		return err
	}
	mt := metrics.New(m)
	mt.RegisterImages(im)
	if nw != nil {
		mt.RegisterNetwork(m)
	}
	bld, err := newBuilder(ctx, cfg, st, catalog, m, im, mt, nw != nil, nodeName, log)
	if err != nil {
		ln.Close()
		return err
	}
	// Running builds are cancelled (and recorded failed) before the
	// Manager closes.
	defer bld.Close()
	// A node pulls the custom builds it does not hold from the cluster
	// registry on first use.
	catalog.SetFetch(bld.Fetch)
	// A node's MCP sessions call the cluster through a front of their own.
	var front *server.Server
	if nodeName != "" {
		front = server.NewFront(server.FrontOptions{Records: st, Nodes: st, Keys: st, Templates: st, Volumes: st,
			Log: log.With("component", "mcp-front"), Config: cfg, Version: version, Domain: domain})
		defer front.CloseFront()
	}
	h := server.New(server.Options{
		Manager: m, Images: im, Keys: st, Log: log, Metrics: mt, Config: cfg, Version: version,
		E2B:     &e2b.Options{Secret: secret, Domain: domain},
		Builder: bld, Templates: st, Catalog: catalog, Volumes: vols,
		ClusterToken: clusterToken(cfg.Cluster), Nodes: st, Node: nodeName, Cluster: front,
	})
	if nodeName != "" {
		beat, err := joinCluster(ctx, cfg, st, m, im, warmed, nodeName, ln.Addr(), log)
		if err != nil {
			ln.Close()
			return err
		}
		go func() {
			select {
			case <-stopping.Done():
				drainNode(ctx, nodeName, cfg.Cluster.DrainTimeout, beat, m, log)
				drained()
			case <-ctx.Done():
			}
		}()
	}
	log.Info("serving", "addr", ln.Addr().String(), "scheme", cfg.Server.Public.Scheme(), "sandbox_domain", domain,
		"version", version, "data_dir", cfg.DataDir, "runtime", cfg.Runtime, "role", cfg.Cluster.Role, "node", nodeName)
	if err := runHTTP(ctx, cfg, h, ln, log); err != nil {
		return err
	}
	log.Info("stopped; sandboxes keep running for the next start")
	return nil
}

// runHTTP serves h on ln until ctx is done, then drains it: new
// connections are refused, streams get the shutdown grace.
func runHTTP(ctx context.Context, cfg config.Config, h *server.Server, ln net.Listener, log *slog.Logger) error {
	// Header and idle timeouts, and the cap on pending connections
	// (internal/server/edge.go).
	hs := h.HTTPServer(slog.NewLogLogger(log.Handler(), slog.LevelWarn))
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()

	select {
	case err := <-errc:
		return fmt.Errorf("serving: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down", "grace", cfg.Server.ShutdownGrace)
	// MCP sessions end first, killing their sandboxes, while the listener
	// still takes connections: on a cluster node they kill through the
	// cluster, which may mean this node's own API. Their event streams
	// would otherwise hold hs.Shutdown for its whole grace period.
	h.CloseMCP()
	gctx, cancel := context.WithTimeout(context.Background(), cfg.Server.ShutdownGrace)
	defer cancel()
	_ = hs.Shutdown(gctx) // stops accepting; waits for plain requests and NDJSON streams
	_ = h.Shutdown(gctx)  // drains WebSocket streams, then cancels what is left
	_ = hs.Close()
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving: %w", err)
	}
	return nil
}

// listenAPI opens the API's listener (TLS when configured) and makes the
// first admin key when the store has none.
func listenAPI(ctx context.Context, cfg config.Config, st store.Backend) (net.Listener, error) {
	ln, err := net.Listen("tcp", cfg.Server.Listen)
	if err != nil {
		return nil, fmt.Errorf("listening: %w", err)
	}
	pln, err := publicListener(ln, cfg.Server.Public)
	if err != nil {
		ln.Close()
		return nil, err
	}
	if err := bootstrapKey(ctx, st, clientURL(pln.Addr(), cfg.Server.Public.Scheme())); err != nil {
		pln.Close()
		return nil, err
	}
	return pln, nil
}

// newBuilder starts the template build engine: builds and uploads under
// the data dir, layers in DATA_DIR/layers, build sandboxes on the
// Manager (with NAT when sandbox networking is up, so that RUN steps reach
// package mirrors).
func newBuilder(ctx context.Context, cfg config.Config, st store.Backend, catalog *template.Catalog,
	m *sandbox.Manager, im *sandbox.Images, mt *metrics.Metrics, networked bool, node string, log *slog.Logger) (*builder.Builder, error) {
	layers, err := layer.Open(filepath.Join(cfg.DataDir, "layers"))
	if err != nil {
		return nil, fmt.Errorf("opening the layer store: %w", err)
	}
	network := sandbox.NetworkNone
	if networked {
		network = sandbox.NetworkNAT
	}
	b := cfg.Server.Builds.WithDefaults()
	var registry string
	var auth *api.RegistryAuth
	if cl := cfg.Cluster; cl.Role == config.RoleNode && cl.Registry != "" {
		registry = cl.Registry
		if cl.RegistryUser != "" || cl.RegistryPassword != "" {
			auth = &api.RegistryAuth{Username: cl.RegistryUser, Password: cl.RegistryPassword}
		}
	}
	return builder.New(ctx, builder.Config{
		DataDir: cfg.DataDir, Node: node, Records: st, Layers: layers, Catalog: catalog, Sandboxes: m, Images: im,
		Network: network, BuildTimeout: b.Timeout, MaxLayerBytes: b.MaxLayerBytes, MaxContextBytes: b.MaxContextBytes,
		MaxPerOwner: b.MaxPerKey, MaxConcurrent: b.MaxConcurrent, Observer: mt, Log: log,
		Registries: image.ServerGuard(b.LoopbackRegistries), ClusterRegistry: registry, ClusterAuth: auth,
	})
}

// bytesFlag is a flag.Value of a size such as 512M or 2G.
type bytesFlag struct{ p *int64 }

func (f bytesFlag) String() string {
	if f.p == nil {
		return ""
	}
	return strconv.FormatInt(*f.p, 10)
}

func (f bytesFlag) Set(s string) error {
	n, err := config.ParseBytes(s)
	if err != nil {
		return err
	}
	if n <= 0 {
		return fmt.Errorf("size %q: want more than 0", s)
	}
	*f.p = n
	return nil
}

// bootstrapKey makes an admin key when the store has none and prints it,
// once, to stdout.
func bootstrapKey(ctx context.Context, st apikey.Store, url string) error {
	keys, err := st.ListKeys(ctx)
	if err != nil {
		return fmt.Errorf("listing API keys: %w", err)
	}
	if len(keys) > 0 {
		return nil
	}
	k, secret := apikey.New("admin", true)
	if err := st.CreateKey(ctx, k); err != nil {
		return fmt.Errorf("creating the admin API key: %w", err)
	}
	fmt.Printf(`
================================================================================
  Kiln created an admin API key. It is shown ONCE: only its hash is stored.

      %s

  Use it with:

      export KILN_URL=%s
      export KILN_API_KEY=%s
================================================================================

`, secret, url, secret)
	return nil
}

// clientURL is the URL a local client reaches the listener at.
func clientURL(addr net.Addr, scheme string) string {
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return scheme + "://" + addr.String()
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return scheme + "://" + net.JoinHostPort(host, port)
}

// raiseNofile sets the open files soft limit to the hard limit explicitly,
// so that the runtimes we start inherit it (Go raises it for itself only)
// and sandboxes, whose nofile limit oci caps at ours, get the most.
func raiseNofile() error {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return err
	}
	lim.Cur = lim.Max
	return unix.Setrlimit(unix.RLIMIT_NOFILE, &lim)
}
