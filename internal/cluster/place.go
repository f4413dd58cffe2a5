package cluster

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// Want is what a create asks of the node that runs it.
type Want struct {
	Runtime string // "" for the node's default
	// Node, if set, is the one node that can serve it (e.g. the node
	// that holds the snapshot it restores).
	Node string
	// Pool, if set, is the pool (PoolName) whose ready sandbox the create
	// could claim: nodes that reported one go first (pools.go). Sent, if
	// set, is how many creates were already sent to a node's pool since
	// its report (PoolHints): they are counted gone.
	Pool string
	Sent func(Node) int
}

// Place orders the live nodes that can take a create, best first: K of
// them sampled at random and sorted by load (best of K, as E2B's API
// places), then the others by load, for retries when a node refuses;
// with want.Pool, the nodes that reported a ready sandbox of that pool
// before the others.
// Nodes without a free slot or without the runtime are left out; none
// left is errdefs.ErrResourceExhausted (errdefs.ErrUnavailable when no
// node is live at all).
func Place(nodes []Node, want Want, k int) ([]Node, error) {
	live, fit := 0, make([]Node, 0, len(nodes))
	for _, n := range nodes {
		if n.State != NodeLive {
			continue
		}
		live++
		if (want.Runtime == "" || slices.Contains(n.Runtimes, want.Runtime)) &&
			(want.Node == "" || want.Node == n.Name) && n.Sandboxes+n.Reserved < n.Slots {
			fit = append(fit, n)
		}
	}
	switch {
	case live == 0:
		return nil, fmt.Errorf("no live node: %w", errdefs.ErrUnavailable)
	case len(fit) == 0 && want.Node != "":
		return nil, fmt.Errorf("node %s cannot take the sandbox (lost, full or without runtime %q): %w",
			want.Node, want.Runtime, errdefs.ErrUnavailable)
	case len(fit) == 0:
		return nil, fmt.Errorf("no live node has a free slot for runtime %q: %w", orDefault(want.Runtime), errdefs.ErrResourceExhausted)
	}
	// Sort indices with each load computed once: Nodes are large to swap.
	idx := rand.Perm(len(fit))
	load := make([]float64, len(fit))
	for i, n := range fit {
		load[i] = Load(n)
	}
	k = min(max(k, 1), len(fit))
	byLoad := func(a, b int) int { return cmp.Compare(load[a], load[b]) }
	slices.SortStableFunc(idx[:k], byLoad)
	slices.SortStableFunc(idx[k:], byLoad)
	if want.Pool != "" {
		preferPooled(idx, fit, want)
	}
	out := make([]Node, len(fit))
	for i, j := range idx {
		out[i] = fit[j]
	}
	return out, nil
}

func orDefault(rt string) string {
	if rt == "" {
		return "default"
	}
	return rt
}

// Load is how full n is, from 0 (idle) to 1 (full): the larger of the
// share of its slots taken (sandboxes and reservations) and the share of
// its memory its sandboxes' limits hold. CPU is left out: sandboxes' CPU
// limits are CFS quotas, overcommitted by design.
func Load(n Node) float64 {
	l := 1.0
	if n.Slots > 0 {
		l = float64(n.Sandboxes+n.Reserved) / float64(n.Slots)
	}
	if n.MemoryBytes > 0 {
		l = max(l, float64(n.AllocatedMemoryBytes)/float64(n.MemoryBytes))
	}
	return l
}

// Directory answers which node is which for routing, from the catalog,
// reusing a listing for up to a second so that a busy front costs the
// catalog one query a second rather than one per request.
type Directory struct {
	st    Store
	cache cached
}

// NewDirectory returns a Directory over st.
func NewDirectory(st Store) *Directory { return &Directory{st: st} }

// Nodes returns every node, at most a second old.
func (d *Directory) Nodes(ctx context.Context) ([]Node, error) { return d.cache.get(ctx, d.st) }

// Node returns the node called name; errdefs.ErrNotFound if the catalog
// has none.
func (d *Directory) Node(ctx context.Context, name string) (Node, error) {
	ns, err := d.Nodes(ctx)
	if err != nil {
		return Node{}, err
	}
	for _, n := range ns {
		if n.Name == name {
			return n, nil
		}
	}
	return Node{}, fmt.Errorf("node %s: %w", name, errdefs.ErrNotFound)
}
