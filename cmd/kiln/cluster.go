package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/kiln-sh/kiln/internal/cluster"
	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/metrics"
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
	mt := metrics.New(nil)
	mt.Registry().MustRegister(cluster.Collector(st))
	h := server.NewFront(server.FrontOptions{Records: st, Nodes: st, Keys: st, Templates: st, Volumes: st,
		Log: log, Config: cfg, Version: version, Metrics: mt, Domain: sandboxDomain(cfg.Server.Public, ln.Addr())})
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
	warmed <-chan struct{}, name string, addr net.Addr, log *slog.Logger) (*cluster.Beat, error) {
	self, err := cluster.Host(name, advertiseURL(cfg, addr), cfg.Cluster.Slots, map[string]string{"runsc": cfg.RunscPath, "runc": cfg.RuncPath})
	if err != nil {
		return nil, err
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

// drainNode is a node's SIGTERM (docs/cluster.md): it is marked draining
// in the catalog (placement passes it over; it keeps heartbeating, so it
// is not marked lost), its Manager refuses new creates (503: fronts place
// them on other nodes), and it waits up to timeout for its sandboxes to
// end while they keep serving. What is left keeps running for its next
// start, which re-adopts them. A second SIGTERM or SIGINT ends the wait.
func drainNode(ctx context.Context, name string, timeout time.Duration, beat *cluster.Beat, m *sandbox.Manager, log *slog.Logger) {
	if timeout <= 0 {
		return
	}
	again := make(chan os.Signal, 1)
	signal.Notify(again, syscall.SIGTERM, os.Interrupt)
	defer signal.Stop(again)
	start := time.Now()
	m.Drain("node " + name + " is draining")
	if err := beat.Drain(ctx); err != nil {
		log.Warn("draining: the catalog did not take the draining state yet; the next heartbeat writes it", "err", err)
	}
	left := m.Active()
	log.Info("draining: new sandboxes are refused; waiting for these to end", "sandboxes", left, "timeout", timeout)
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for left > 0 {
		select {
		case <-deadline.C:
			log.Info("drain timeout: the sandboxes left keep running for the next start", "sandboxes", left)
			return
		case <-again:
			log.Info("signalled again: ending the drain; the sandboxes left keep running for the next start", "sandboxes", left)
			return
		case <-ctx.Done():
			return
		case <-tick.C:
			left = m.Active()
		}
	}
	log.Info("drained: no sandbox left", "took", time.Since(start).Round(time.Millisecond))
}
