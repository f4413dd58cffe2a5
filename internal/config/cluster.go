package config

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Roles of kiln serve (Cluster.Role, docs/cluster.md).
const (
	// RoleAll is one machine: API and sandboxes in one process (the
	// default, and what kiln serve always was).
	RoleAll = "all"
	// RoleNode runs sandboxes, registers itself in the catalog and
	// serves its API only to fronts (every request needs the cluster
	// token).
	RoleNode = "node"
	// RoleFront runs no sandboxes: it serves the public API from the
	// catalog, places creates on nodes and proxies per-sandbox traffic
	// to the owning node.
	RoleFront = "front"
)

// Cluster configures kiln serve as part of a cluster of fronts and nodes
// sharing one PostgreSQL catalog (internal/cluster, docs/cluster.md).
type Cluster struct {
	// Role is RoleAll (""), RoleNode or RoleFront (KILN_ROLE, --role).
	Role string
	// NodeName names this node in the catalog and in its sandboxes'
	// records (KILN_NODE_NAME, --node-name; default the hostname).
	NodeName string
	// Token authenticates fronts to nodes (KILN_CLUSTER_TOKEN,
	// --cluster-token): at least 32 characters, the same on every front
	// and node. Required for roles node and front.
	Token string
	// AdvertiseURL is the base URL fronts reach this node's API at
	// (KILN_ADVERTISE_URL, --advertise-url; default http://LISTEN, which
	// only works when LISTEN names a reachable address).
	AdvertiseURL string
	// Heartbeat is how often a node writes its heartbeat to the catalog
	// (KILN_HEARTBEAT_INTERVAL, default 2s).
	Heartbeat time.Duration
	// LostAfter is how many heartbeats a node may miss before it and its
	// sandboxes are marked lost (KILN_NODE_LOST_AFTER, default 5).
	LostAfter int
	// Slots is how many sandboxes that have not ended a node takes
	// (KILN_NODE_SLOTS, --node-slots; default 256).
	Slots int
	// PlacementK is how many live nodes a front samples per create
	// before it picks the least loaded (KILN_PLACEMENT_K, default 3).
	PlacementK int
	// Registry is where nodes keep custom template builds for each other
	// (KILN_CLUSTER_REGISTRY, --cluster-registry): an OCI registry and
	// repository prefix, e.g. "registry.internal/kiln" or
	// "127.0.0.1:5000/kiln". A node pushes each build there before it
	// marks it ready, and pulls a build it does not hold on first use.
	// Empty: a custom template's sandboxes run on the node that built it.
	// Registries on loopback and private addresses are spoken to over
	// plain HTTP, others over HTTPS.
	Registry string
	// RegistryUser and RegistryPassword log nodes in to Registry
	// (KILN_CLUSTER_REGISTRY_USER, KILN_CLUSTER_REGISTRY_PASSWORD; the
	// environment only): none is anonymous, a password alone a bearer
	// token.
	RegistryUser, RegistryPassword string
	// SnapshotDir is a directory every node mounts at the same path (NFS,
	// or a shared directory on one machine) where nodes keep the images
	// of paused sandboxes and named snapshots, so that any node can
	// restore them (KILN_SNAPSHOT_DIR, --snapshot-dir; docs/snapshots.md).
	// "" keeps them in the node's data dir, restorable there only.
	SnapshotDir string
	// DrainTimeout is how long a node that got SIGTERM waits for its
	// sandboxes to end, marked draining (no new creates), before it exits
	// leaving the rest running for its next start (KILN_DRAIN_TIMEOUT,
	// --drain-timeout; default 30s; 0 exits at once).
	DrainTimeout time.Duration
	// Pools are pool sizes across the cluster (KILN_CLUSTER_POOL,
	// --cluster-pool, e.g. "code-interpreter=6"; nodes only): each node
	// keeps ceil(N / live nodes) ready sandboxes of the template, or its
	// own --pool size if larger (docs/pools.md).
	Pools    ClusterPools
	poolsErr error // a malformed KILN_CLUSTER_POOL, for validate
}

// TokenMinLength is the shortest cluster token accepted.
const TokenMinLength = 32

func defaultCluster() Cluster {
	return Cluster{Role: RoleAll, Heartbeat: 2 * time.Second, LostAfter: 5, Slots: 256, PlacementK: 3,
		DrainTimeout: 30 * time.Second}
}

func clusterFromEnv(c Cluster) Cluster {
	for dst, key := range map[*string]string{
		&c.Role: "KILN_ROLE", &c.NodeName: "KILN_NODE_NAME", &c.Token: "KILN_CLUSTER_TOKEN",
		&c.AdvertiseURL: "KILN_ADVERTISE_URL", &c.Registry: "KILN_CLUSTER_REGISTRY", &c.SnapshotDir: "KILN_SNAPSHOT_DIR",
		&c.RegistryUser: "KILN_CLUSTER_REGISTRY_USER", &c.RegistryPassword: "KILN_CLUSTER_REGISTRY_PASSWORD",
	} {
		if v := os.Getenv(key); v != "" {
			*dst = v
		}
	}
	// Malformed numbers are kept as invalid values for validate.
	for dst, key := range map[*time.Duration]string{&c.Heartbeat: "KILN_HEARTBEAT_INTERVAL", &c.DrainTimeout: "KILN_DRAIN_TIMEOUT"} {
		if v := os.Getenv(key); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil {
				d = -1
			}
			*dst = d
		}
	}
	for dst, key := range map[*int]string{&c.LostAfter: "KILN_NODE_LOST_AFTER", &c.Slots: "KILN_NODE_SLOTS", &c.PlacementK: "KILN_PLACEMENT_K"} {
		if v := os.Getenv(key); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				n = -1
			}
			*dst = n
		}
	}
	if v := os.Getenv("KILN_CLUSTER_POOL"); v != "" {
		c.Pools = ClusterPools{}
		c.poolsErr = c.Pools.Set(v)
	}
	return c
}

// nodeNameRE is what a node name may be: it is stored in records and
// shown in errors.
var nodeNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// ValidNodeName reports whether s can name a node.
func ValidNodeName(s string) bool { return nodeNameRE.MatchString(s) }

// registryRE is what a cluster registry may be: a registry host (a name
// with a dot, localhost, or an address; a port) and repository path
// components in the OCI distribution grammar.
var registryRE = regexp.MustCompile(`^(localhost|[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+|\[[0-9A-Fa-f:]+\])(:[0-9]{1,5})?` +
	`(/[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*)*$`)

// ValidRegistry reports whether s can be a cluster registry: host[:port]
// then an optional repository prefix, at most 200 bytes.
func ValidRegistry(s string) bool { return len(s) <= 200 && registryRE.MatchString(s) }

// Silence is how long a node may go without a heartbeat before it is
// marked lost.
func (c Cluster) Silence() time.Duration { return c.Heartbeat * time.Duration(c.LostAfter) }

// Clustered reports whether this process is a front or a node.
func (c Cluster) Clustered() bool { return c.Role == RoleNode || c.Role == RoleFront }

func (c Cluster) validate(store string) error {
	if c.SnapshotDir != "" && (!filepath.IsAbs(c.SnapshotDir) || filepath.Clean(c.SnapshotDir) != c.SnapshotDir) {
		return fmt.Errorf("snapshot dir %q (KILN_SNAPSHOT_DIR, --snapshot-dir) must be a clean absolute path", c.SnapshotDir)
	}
	if c.poolsErr != nil {
		return fmt.Errorf("KILN_CLUSTER_POOL: %w", c.poolsErr)
	}
	if len(c.Pools) > 0 && c.Role != RoleNode {
		return errors.New("cluster-wide pools (KILN_CLUSTER_POOL, --cluster-pool) are for --role node; one machine takes --pool (KILN_POOL)")
	}
	switch c.Role {
	case "", RoleAll:
		return nil
	case RoleNode, RoleFront:
	default:
		return fmt.Errorf("role %q (KILN_ROLE, --role): want all, node or front", c.Role)
	}
	var errs []error
	if !strings.HasPrefix(store, "postgres://") && !strings.HasPrefix(store, "postgresql://") {
		errs = append(errs, fmt.Errorf("role %s needs the shared catalog: --store postgres://… (KILN_STORE)", c.Role))
	}
	if len(c.Token) < TokenMinLength {
		errs = append(errs, fmt.Errorf("role %s needs a cluster token of at least %d characters (KILN_CLUSTER_TOKEN, --cluster-token)", c.Role, TokenMinLength))
	}
	if c.Heartbeat < 100*time.Millisecond || c.Heartbeat > time.Minute {
		errs = append(errs, errors.New("heartbeat interval (KILN_HEARTBEAT_INTERVAL) must be a duration between 100ms and 1m"))
	}
	if c.Registry != "" && !ValidRegistry(c.Registry) {
		errs = append(errs, fmt.Errorf("cluster registry %q (KILN_CLUSTER_REGISTRY, --cluster-registry): want host[:port][/repository/prefix], "+
			"e.g. registry.internal/kiln or 127.0.0.1:5000/kiln", c.Registry[:min(len(c.Registry), 100)]))
	}
	if c.LostAfter < 2 || c.LostAfter > 100 {
		errs = append(errs, errors.New("heartbeats missed before a node is lost (KILN_NODE_LOST_AFTER) must be between 2 and 100"))
	}
	if c.Role == RoleNode {
		if c.NodeName != "" && !ValidNodeName(c.NodeName) {
			errs = append(errs, fmt.Errorf("node name %q (KILN_NODE_NAME, --node-name): want up to 63 letters, digits, '.', '_' or '-'", c.NodeName))
		}
		if c.DrainTimeout < 0 || c.DrainTimeout > 24*time.Hour {
			errs = append(errs, errors.New("drain timeout (KILN_DRAIN_TIMEOUT, --drain-timeout) must be a duration between 0 and 24h"))
		}
		if c.Slots < 1 || c.Slots > 100000 {
			errs = append(errs, errors.New("node slots (KILN_NODE_SLOTS, --node-slots) must be between 1 and 100000"))
		}
		if c.AdvertiseURL != "" {
			if u, err := url.Parse(c.AdvertiseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" ||
				(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
				errs = append(errs, fmt.Errorf("advertise URL %q (KILN_ADVERTISE_URL, --advertise-url): want http(s)://host:port", c.AdvertiseURL))
			}
		}
	}
	if c.Role == RoleFront && (c.PlacementK < 1 || c.PlacementK > 1000) {
		errs = append(errs, errors.New("placement sample size (KILN_PLACEMENT_K) must be between 1 and 1000"))
	}
	return errors.Join(errs...)
}
