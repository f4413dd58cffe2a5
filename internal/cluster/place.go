package cluster

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// Want is what a create asks of the node that runs it.
type Want struct {
	Runtime string // "" for the node's default
	// Node, if set, is the one node that can serve it (e.g. the node
	// that holds the snapshot it restores).
	Node string
	// Build, if set, is the custom template build it starts from: nodes
	// that hold it (Node.Builds) come first, the others pull it.
	Build string
	// Prefer, if set, is the node to try first when it fits (the node
	// a snapshot in shared storage was taken on); the others follow.
	Prefer string
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
// Nodes without a free slot, short of disk or without the runtime are
// left out; none
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
			(want.Node == "" || want.Node == n.Name) && n.Sandboxes+n.Reserved < n.Slots && !n.ShortOfDisk() {
			fit = append(fit, n)
		}
	}
	switch {
	case live == 0:
		return nil, fmt.Errorf("no live node: %w", errdefs.ErrUnavailable)
	case len(fit) == 0 && want.Node != "":
		return nil, fmt.Errorf("node %s cannot take the sandbox (lost, full, short of disk or without runtime %q): %w",
			want.Node, want.Runtime, errdefs.ErrUnavailable)
	case len(fit) == 0:
		return nil, fmt.Errorf("no live node has a free slot and %d GiB of free disk for runtime %q: %w",
			MinFreeDisk>>30, orDefault(want.Runtime), errdefs.ErrResourceExhausted)
	}
	out := fit
	if want.Build == "" {
		out = byLoad(fit, want, k)
	} else { // nodes that hold the build first
		var has, not []Node
		for _, n := range fit {
			if slices.Contains(n.Builds, want.Build) {
				has = append(has, n)
			} else {
				not = append(not, n)
			}
		}
		out = append(byLoad(has, want, k), byLoad(not, want, k)...)
	}
	if i := slices.IndexFunc(out, func(n Node) bool { return n.Name == want.Prefer }); i > 0 {
		p := out[i]
		copy(out[1:i+1], out[:i])
		out[0] = p
	}
	return out, nil
}

// byLoad orders nodes as Place does: K sampled at random and sorted by
// load, then the rest by load; with want.Pool, those with a ready pooled
// sandbox first.
func byLoad(fit []Node, want Want, k int) []Node {
	if len(fit) == 0 {
		return nil
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
	return out
}

// Affine returns the live node that ranks first for key: the highest
// hash of key and the node's name (rendezvous hashing). Every front
// picks the same node for a key while the live nodes are the same, and
// a node that comes or goes moves only the keys that rank it first. ok
// is false when no node is live.
func Affine(nodes []Node, key string) (_ Node, ok bool) {
	var (
		best  Node
		score uint64
	)
	for _, n := range nodes {
		if n.State != NodeLive {
			continue
		}
		sum := sha256.Sum256([]byte(key + "\x00" + n.Name))
		if h := binary.BigEndian.Uint64(sum[:8]); !ok || h > score {
			best, score, ok = n, h, true
		}
	}
	return best, ok
}

func orDefault(rt string) string {
	if rt == "" {
		return "default"
	}
	return rt
}

// MinFreeDisk is the free space of its data dir's file system below which
// a node takes no new sandbox (their disks, snapshots and templates grow
// there).
const MinFreeDisk = 1 << 30

// ShortOfDisk reports whether n reported less free disk than MinFreeDisk
// (a node that reported none is not).
func (n Node) ShortOfDisk() bool { return n.DiskBytes > 0 && n.DiskFreeBytes < MinFreeDisk }

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
// catalog one query a second rather than one per request; and whether a
// node is expected to answer (Answering).
type Directory struct {
	st    Store
	cache cached
	// maxQuiet is how long a node may go without a heartbeat before
	// requests to it fail at once.
	maxQuiet time.Duration
}

// NewDirectory returns a Directory over st that takes a node silent for
// longer than maxQuiet for one that does not answer (0: never).
func NewDirectory(st Store, maxQuiet time.Duration) *Directory {
	return &Directory{st: st, maxQuiet: maxQuiet}
}

// Nodes returns every node, at most a second old.
func (d *Directory) Nodes(ctx context.Context) ([]Node, error) {
	return d.cache.get(ctx, d.st, cacheTTL)
}

// Node returns the node called name; errdefs.ErrNotFound if the catalog
// has none. A node the listing lacks is looked for again in a fresh one
// (it may have registered within the second).
func (d *Directory) Node(ctx context.Context, name string) (Node, error) {
	for _, maxAge := range []time.Duration{cacheTTL, missTTL} {
		ns, err := d.cache.get(ctx, d.st, maxAge)
		if err != nil {
			return Node{}, err
		}
		for _, n := range ns {
			if n.Name == name {
				return n, nil
			}
		}
	}
	return Node{}, fmt.Errorf("node %s: %w", name, errdefs.ErrNotFound)
}

// Answering returns nil if n is expected to answer requests: it serves
// (live or draining) and has heartbeat within maxQuiet. Otherwise it is
// errdefs.ErrUnavailable naming the node and why: a node that accepts
// connections and never answers (a stopped process, a partition) is
// refused at once, not waited on. A quiet node is refused only when the
// catalog is known to take heartbeats: another node's is recent, and
// this front has not failed to read the catalog lately. When every node
// is quiet, the catalog is more likely in trouble (down, or too slow for
// heartbeats) than every node frozen, and refusing them all would stop
// the cluster for nothing.
func (d *Directory) Answering(n Node) error {
	if !n.Serving() {
		return fmt.Errorf("node %s is %s: %w", n.Name, n.State, errdefs.ErrUnavailable)
	}
	now := time.Now()
	q := n.QuietFor(now)
	if d.maxQuiet <= 0 || q <= d.maxQuiet || now.Sub(d.cache.failedAt()) < d.maxQuiet ||
		now.Sub(d.cache.heardAt()) > d.maxQuiet {
		return nil
	}
	return fmt.Errorf("node %s is not answering: no heartbeat for %v: %w", n.Name, q.Round(100*time.Millisecond), errdefs.ErrUnavailable)
}
