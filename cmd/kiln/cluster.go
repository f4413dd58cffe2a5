package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"

	"github.com/kiln-sh/kiln/internal/cluster"
	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/server"
	"github.com/kiln-sh/kiln/internal/store"
)

// serveFront runs a cluster front: the public API over the catalog, no
// sandboxes (docs/cluster.md).
func serveFront(ctx context.Context, cfg config.Config, st store.Backend, log *slog.Logger) error {
	ln, err := listenAPI(ctx, cfg, st)
	if err != nil {
		return err
	}
	h := server.NewFront(server.FrontOptions{Records: st, Nodes: st, Keys: st, Templates: st, Volumes: st,
		Log: log, Config: cfg, Version: version})
	defer h.CloseFront()
	go cluster.Sweep(ctx, st, cfg.Cluster.Heartbeat, cfg.Cluster.Silence(), log.With("component", "cluster"))
	log.Info("serving", "addr", ln.Addr().String(), "scheme", cfg.Server.Public.Scheme(), "version", version, "role", cfg.Cluster.Role)
	if err := runHTTP(ctx, cfg, h, ln, log); err != nil {
		return err
	}
	log.Info("stopped")
	return nil
}

// joinCluster registers this node in the catalog, then keeps its
// heartbeat and sweeps for lost nodes in the background until ctx ends.
// Its pools (im) are reported to the catalog, and sized across the
// cluster once warmed is closed when it has --cluster-pool.
func joinCluster(ctx context.Context, cfg config.Config, st store.Backend, m *sandbox.Manager, im *sandbox.Images,
	warmed <-chan struct{}, name string, addr net.Addr, log *slog.Logger) error {
	self, err := cluster.Host(name, advertiseURL(cfg, addr), cfg.Cluster.Slots, map[string]string{"runsc": cfg.RunscPath, "runc": cfg.RuncPath})
	if err != nil {
		return err
	}
	return cluster.Join(ctx, cluster.Member{
		Nodes: st, Records: st, Sandboxes: m, Self: self, DataDir: cfg.DataDir,
		Interval: cfg.Cluster.Heartbeat, Silence: cfg.Cluster.Silence(), Log: log.With("component", "cluster"),
		Images: im, LocalPools: cfg.Server.Pools, ClusterPools: cfg.Cluster.Pools, PoolsAfter: warmed,
	})
}

// clusterNodeName is this node's name: the configured one, else the
// hostname.
func clusterNodeName(c config.Cluster) (string, error) {
	if c.NodeName != "" {
		return c.NodeName, nil
	}
	h, err := os.Hostname()
	if err != nil || !config.ValidNodeName(h) {
		return "", fmt.Errorf("the hostname %q cannot name this node: set --node-name (KILN_NODE_NAME)", h)
	}
	return h, nil
}

// clusterToken is the token a node's API demands ("" off a node).
func clusterToken(c config.Cluster) string {
	if c.Role == config.RoleNode {
		return c.Token
	}
	return ""
}

// advertiseURL is the URL fronts reach this node at: the configured one,
// else the listener's address (the hostname for a wildcard listener).
func advertiseURL(cfg config.Config, addr net.Addr) string {
	if u := cfg.Cluster.AdvertiseURL; u != "" {
		return u
	}
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return cfg.Server.Public.Scheme() + "://" + addr.String()
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		if h, err := os.Hostname(); err == nil {
			host = h
		}
	}
	return cfg.Server.Public.Scheme() + "://" + net.JoinHostPort(host, port)
}
