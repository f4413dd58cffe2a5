package servetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/client"
	"github.com/kiln-sh/kiln/internal/cluster"
	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/network/nettest"
)

// Cluster is a running Kiln cluster (docs/cluster.md): fronts and nodes,
// each a kiln serve process on loopback with its own data dir (sharing
// the built templates), around one PostgreSQL catalog.
type Cluster struct {
	// Fronts serve the public API; each Server's Key is the admin key
	// the first front made, its Client talks to that front, and its
	// World is the first node's (nil without ClusterOptions.Network).
	Fronts []*Server
	Nodes  []*ClusterNode
	Token  string // the cluster token
	Domain string // the sandboxes' domain: the first front's localhost:PORT
}

// ClusterNode is one node of a Cluster.
type ClusterNode struct {
	Name, URL string
	// World is the test world of its sandbox networking (one per node:
	// two kiln serve cannot share a host namespace's tables); nil
	// without ClusterOptions.Network.
	World *nettest.World
}

// ClusterOptions shape StartCluster's cluster.
type ClusterOptions struct {
	// Store is the catalog: a postgres:// URL (pgtest.URL).
	Store         string
	Fronts, Nodes int // default 1 and 2
	// Network gives each node sandbox networking in a test world of its
	// own (nettest.NewStandard); without it KILN_NETWORK=off.
	Network bool
	// Env is added to every process's environment.
	Env []string
}

// Timings of test clusters: a node missing 8 heartbeats of 1 s is lost,
// so that a node starved of CPU for a few seconds by a loaded machine is
// not.
const (
	clusterHeartbeat = time.Second
	clusterLostAfter = 8
)

// StartCluster starts a cluster from the kiln binary: the first front
// (which makes the admin key on the empty catalog), then the other
// fronts and the nodes (node-a, node-b, …), and returns once every one
// answers and the catalog lists the nodes live. Nodes are given the first
// front's domain (KILN_DOMAIN), so the E2B SDKs' port URLs go through it.
// Cleanup kills the sandboxes still alive through a front, then stops
// every process.
func StartCluster(t testing.TB, kiln string, o ClusterOptions) *Cluster {
	t.Helper()
	if o.Fronts <= 0 {
		o.Fronts = 1
	}
	if o.Nodes <= 0 {
		o.Nodes = 2
	}
	tok := make([]byte, 24)
	_, _ = rand.Read(tok)
	c := &Cluster{Token: hex.EncodeToString(tok)}
	var procs []*Proc
	t.Cleanup(func() {
		if len(c.Fronts) > 0 {
			c.Fronts[0].killAlive(t)
		}
		for _, p := range procs {
			p.Stop(t)
		}
	})
	env := func(name, role string, more ...string) []string {
		e := []string{"KILN_ROLE=" + role, "KILN_STORE=" + o.Store, "KILN_CLUSTER_TOKEN=" + c.Token,
			"KILN_NODE_NAME=" + name, "KILN_HEARTBEAT_INTERVAL=" + clusterHeartbeat.String(),
			fmt.Sprintf("KILN_NODE_LOST_AFTER=%d", clusterLostAfter)}
		return append(append(e, o.Env...), more...)
	}
	frontAddrs := make([]string, o.Fronts)
	for i := range frontAddrs {
		frontAddrs[i] = FreeAddr(t)
	}
	_, port, _ := strings.Cut(frontAddrs[0], ":")
	c.Domain = "localhost:" + port
	for i, addr := range frontAddrs {
		name := fmt.Sprintf("front-%d", i+1)
		p := StartProc(t, kiln, name, DataDir(t), addr, env(name, config.RoleFront, "KILN_DOMAIN="+c.Domain))
		procs = append(procs, p)
		if i == 0 { // the others after it: it makes the admin key
			p.Ready(t, "")
			c.Fronts = append(c.Fronts, &Server{URL: p.URL, Key: p.AdminKey(t)})
		} else {
			c.Fronts = append(c.Fronts, &Server{URL: p.URL, Key: c.Fronts[0].Key})
		}
	}
	var names []string
	for i := range o.Nodes {
		n := &ClusterNode{Name: fmt.Sprintf("node-%c", 'a'+i)}
		more := []string{"KILN_DOMAIN=" + c.Domain, "KILN_NETWORK=off"}
		if o.Network {
			n.World = nettest.NewStandard(t)
			more = append(more[:1], n.World.ServeEnv()...)
		}
		p := StartProc(t, kiln, n.Name, DataDir(t), FreeAddr(t), env(n.Name, config.RoleNode, more...))
		procs = append(procs, p)
		n.URL = p.URL
		c.Nodes, names = append(c.Nodes, n), append(names, n.Name)
	}
	for _, p := range procs[1:] {
		p.Ready(t, c.Token)
	}
	for _, f := range c.Fronts {
		f.Client = client.New(f.URL, f.Key)
		f.World = c.Nodes[0].World
	}
	WaitNodesLive(t, frontNodes{c.Fronts[0].Client}, 30*time.Second, names...)
	return c
}

// frontNodes reads the node registry through a front (GET /v1/nodes).
type frontNodes struct{ c *client.Client }

func (f frontNodes) Nodes(ctx context.Context) ([]cluster.Node, error) {
	ns, err := f.c.Nodes(ctx)
	out := make([]cluster.Node, 0, len(ns))
	for _, n := range ns {
		out = append(out, cluster.Node{Name: n.Name, State: n.State})
	}
	return out, err
}
