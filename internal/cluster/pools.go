package cluster

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/template"
)

// Pools in a cluster (docs/pools.md, "Pools in a cluster"). Each node
// keeps its own pools of ready sandboxes (sandbox.Images), sized by its
// --pool (per node) and --cluster-pool (across the live nodes: each keeps
// its share, rounded up). It reports its ready sandboxes per pool to the
// catalog every heartbeat interval (Store.SetNodePools); a front places a
// create that a pooled sandbox could serve on a node that reported one
// ready first, so the create claims it instead of booting one. The
// reports are hints, a heartbeat old at most: a create that finds the
// pool empty boots as on any node, so they never make a create fail.

// PoolName is the name a pool of template reference ref has (name, or
// name:tag for a tag other than the default, as --pool names pools); ""
// for a malformed ref.
func PoolName(ref string) string {
	name, tag, err := template.ParseRef(ref)
	switch {
	case err != nil:
		return ""
	case tag != template.DefaultTag:
		return name + ":" + tag
	}
	return name
}

// PoolSizes are the pool sizes of one node of a cluster of live nodes:
// for every template, the larger of its own size (local) and its share
// of the size across the cluster (ceil(across / live)), at most
// config.MaxPoolSize.
func PoolSizes(local, across map[string]int, live int) map[string]int {
	live = max(live, 1)
	out := maps.Clone(local)
	if out == nil {
		out = map[string]int{}
	}
	for name, n := range across {
		share := min((n+live-1)/live, config.MaxPoolSize)
		out[name] = max(out[name], share)
	}
	return out
}

// preferPooled moves the indices of the nodes of fit that have a ready
// sandbox of want.Pool left (PoolReady) to the front of order, keeping the
// order within each part.
func preferPooled(order []int, fit []Node, want Want) {
	rank := make([]int, len(fit))
	for i, n := range fit {
		if PoolReady(n, want) == 0 {
			rank[i] = 1
		}
	}
	slices.SortStableFunc(order, func(a, b int) int { return rank[a] - rank[b] })
}

// PoolReady is how many ready sandboxes of want.Pool node n reported,
// less those want.Sent counts gone.
func PoolReady(n Node, want Want) int {
	ready := n.Pools[want.Pool]
	if ready > 0 && want.Sent != nil {
		ready -= want.Sent(n)
	}
	return max(ready, 0)
}

// PoolHints is a front's count of the creates it sent to each node for
// its pooled sandboxes since the node's last report: every front reads
// the same reports, and a burst of creates must not all go to the one
// node that reported one ready sandbox. Fronts do not share their counts,
// so with F fronts a node that reported r ready may get up to F × r
// creates for them before its next report; the others boot.
type PoolHints struct {
	mu   sync.Mutex
	sent map[poolKey]sentSince
}

type poolKey struct{ node, pool string }

// sentSince is how many creates went to a node's pool since its report
// of at.
type sentSince struct {
	at time.Time
	n  int
}

// Place is Place with the creates this front sent to each node's pool
// since the node's report counted gone (want.Sent); the create is counted
// against the first node of the order if that node had one left.
func (h *PoolHints) Place(nodes []Node, want Want, k int) ([]Node, error) {
	if want.Pool == "" {
		return Place(nodes, want, k)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.sent == nil {
		h.sent = map[poolKey]sentSince{}
	}
	want.Sent = func(n Node) int {
		if s := h.sent[poolKey{n.Name, want.Pool}]; s.at.Equal(n.PoolsAt) {
			return s.n
		}
		return 0
	}
	order, err := Place(nodes, want, k)
	if err != nil || PoolReady(order[0], want) == 0 {
		return order, err
	}
	key := poolKey{order[0].Name, want.Pool}
	s := h.sent[key]
	if !s.at.Equal(order[0].PoolsAt) {
		s = sentSince{at: order[0].PoolsAt}
	}
	s.n++
	h.sent[key] = s
	return order, nil
}

// keepPools, on a node, sets its pool sizes from the live nodes (when it
// has sizes across the cluster) and reports its ready pooled sandboxes,
// every heartbeat interval until ctx ends. Sizes wait for m.PoolsAfter
// (the warm checkpoints' builds at start).
func (m Member) keepPools(ctx context.Context) {
	t := time.NewTicker(m.Interval)
	defer t.Stop()
	var k poolKeeper
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// A round may not outlast its interval, as a heartbeat.
		tctx, cancel := context.WithTimeout(ctx, m.Interval)
		err := k.round(tctx, m)
		cancel()
		if err != nil && !failing && ctx.Err() == nil {
			m.Log.Warn("keeping the pools", "err", err)
		}
		failing = err != nil
	}
}

// poolKeeper is what keepPools remembers between rounds.
type poolKeeper struct {
	sized         map[string]int // the sizes last set
	reportedEmpty bool           // an empty report was written
}

// round sets the pools' sizes (with sizes across the cluster) and writes
// the node's pool report.
func (k *poolKeeper) round(ctx context.Context, m Member) error {
	if len(m.ClusterPools) > 0 && ready(m.PoolsAfter) {
		live, err := m.liveNodes(ctx)
		if err != nil {
			return fmt.Errorf("counting live nodes for the pools' sizes: %w", err)
		}
		sizes := PoolSizes(m.LocalPools, m.ClusterPools, live)
		if !maps.Equal(sizes, k.sized) {
			m.Log.Info("pool sizes", "sizes", sizes, "live_nodes", live, "across_cluster", m.ClusterPools)
			k.sized = sizes
		}
		// Every round: it also trims a pool a late fill overfilled.
		m.Images.SetPoolSizes(sizes)
	}
	counts := map[string]int{}
	for _, st := range m.Images.PoolStats() {
		counts[st.Template] = st.Ready
	}
	// A report with pools is written every round, even unchanged: its
	// new time tells fronts to count afresh. A node without pools writes
	// its empty report once.
	if len(counts) == 0 && k.reportedEmpty {
		return nil
	}
	if err := m.Nodes.SetNodePools(ctx, m.Self.Name, counts); err != nil {
		return err
	}
	k.reportedEmpty = len(counts) == 0
	return nil
}

// liveNodes counts the live nodes in the catalog (this one at least).
func (m Member) liveNodes(ctx context.Context) (int, error) {
	ns, err := m.Nodes.Nodes(ctx)
	if err != nil {
		return 0, err
	}
	live := 0
	for _, n := range ns {
		if n.State == NodeLive {
			live++
		}
	}
	return max(live, 1), nil
}

// ready reports whether c is closed (a nil c is).
func ready(c <-chan struct{}) bool {
	if c == nil {
		return true
	}
	select {
	case <-c:
		return true
	default:
		return false
	}
}
