// Package cluster is what makes several kiln serve processes one Kiln:
// nodes register themselves in the catalog (the shared store) and
// heartbeat; a node that falls silent is marked lost with its sandboxes;
// fronts place creates on live nodes (best of K by free capacity, with an
// atomic reservation so two fronts never overfill a node) and proxy every
// per-sandbox request to the owning node with the cluster token. The
// catalog's tables are kept by both store backends (Store);
// docs/cluster.md describes how to run it.
package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// States of a node in the catalog.
const (
	NodeLive = "live"
	// NodeDraining is a node that is stopping (SIGTERM): placement skips
	// it, its sandboxes are served until they end or its drain timeout.
	NodeDraining = "draining"
	NodeLost     = "lost"
)

// TokenHeader carries the cluster token from a front to a node, and
// RequestIDHeader the front's request id, which the node adopts.
const (
	TokenHeader     = "Kiln-Cluster-Token"
	RequestIDHeader = "Kiln-Request-Id"
)

// Node is one kiln serve of role node as the catalog knows it.
type Node struct {
	Name  string
	URL   string // base URL of its API, for fronts
	State string // NodeLive, NodeDraining or NodeLost
	// Reason says why a lost node was marked lost.
	Reason string

	// Capacity, reported by the node.
	CPUs        float64
	MemoryBytes int64
	// DiskBytes and DiskFreeBytes are the size and free space (for
	// unprivileged use) of the file system of its data dir (sandbox
	// disks, templates, snapshots), as of its last heartbeat.
	DiskBytes, DiskFreeBytes int64
	Slots                    int      // sandboxes that have not ended it takes
	Runtimes                 []string // runsc, runc: those it can run
	Templates                []string // built-in templates it has
	// Builds are the custom template builds whose files it holds (built
	// there, or pulled from the cluster registry): fronts prefer these
	// nodes for the builds' sandboxes.
	Builds []string

	StartedAt   time.Time
	HeartbeatAt time.Time // the catalog's clock
	// Quiet is how long the node had been silent when Store.Nodes read
	// it (at ReadAt, this host's clock): since its last heartbeat, or
	// since the catalog's database started if that is later (heartbeats
	// it could not write while the catalog was down do not count), on
	// the catalog's clock.
	Quiet  time.Duration
	ReadAt time.Time

	// Pools are the node's ready pooled sandboxes by pool name (a
	// template reference) as it last reported them (Store.SetNodePools),
	// at PoolsAt (the catalog's clock): a hint for placement (pools.go).
	Pools   map[string]int
	PoolsAt time.Time

	// Load, computed by Store.Nodes from the catalog's records: its
	// sandboxes that have not ended, the placements reserved on it and
	// not yet released or expired, and the limits its sandboxes hold.
	Sandboxes            int
	Reserved             int
	AllocatedCPUs        float64
	AllocatedMemoryBytes int64
}

// QuietFor is how long n has been silent at now (this host's clock).
func (n Node) QuietFor(now time.Time) time.Duration { return n.Quiet + now.Sub(n.ReadAt) }

// Serving reports whether n serves its sandboxes: live or draining.
func (n Node) Serving() bool { return n.State == NodeLive || n.State == NodeDraining }

// BeatState is the state a heartbeat of n writes: draining if n says so,
// else live.
func (n Node) BeatState() string {
	if n.State == NodeDraining {
		return NodeDraining
	}
	return NodeLive
}

// Store is the catalog's node registry, kept by both store backends
// (internal/store/sqlite, internal/store/postgres; storetest checks them).
// Sandbox records are sandbox.Store's; a node's sandboxes are those whose
// record names it.
type Store interface {
	// Heartbeat records n as live (draining, if n.State says so) with
	// its capacity, its heartbeat the store's now; a node marked lost
	// comes back, and revived says so (its sandboxes were failed
	// meanwhile).
	Heartbeat(ctx context.Context, n Node) (revived bool, err error)
	// Nodes returns every registered node with its load, by name.
	Nodes(ctx context.Context) ([]Node, error)
	// MarkLost marks lost every live or draining node whose last
	// heartbeat is older than silence (PostgreSQL: and whose database
	// has been up for as long), with the sandboxes it held that had not
	// ended: they become failed with a reason naming the node, except
	// paused ones whose image is in the shared snapshot dir (another node
	// can resume them: MoveSandbox). It returns the nodes
	// it marked. Concurrent callers (every front and node sweeps) never
	// mark one node twice.
	MarkLost(ctx context.Context, silence time.Duration) ([]Node, error)
	// Reserve admits one more sandbox, atomically: if its owner stays
	// within its quota across the cluster (its sandboxes that have not
	// ended on every node plus its unexpired reservations), and the node
	// is live with fewer sandboxes that have not ended plus unexpired
	// reservations than its slots, it records a reservation that expires
	// after ttl and returns its id. Over quota or a full node is
	// errdefs.ErrResourceExhausted, a lost node errdefs.ErrUnavailable, an
	// unknown one errdefs.ErrNotFound.
	Reserve(ctx context.Context, r Reservation, ttl time.Duration) (string, error)
	// Release drops a reservation (the create it admitted failed);
	// releasing a missing one succeeds. A create that succeeded needs
	// none: PutSandbox of a new record takes the place of one
	// reservation of its owner on its node, in the same transaction, so
	// it is counted once, never twice nor not at all.
	Release(ctx context.Context, id string) error
	// MoveSandbox moves the record of sandbox id, paused with its image in
	// the shared snapshot dir, from node from, which must not be live or draining, to
	// node to: a compare-and-swap on the record's node, so of concurrent
	// moves one succeeds. The others, and a record that is no longer so
	// (resumed, killed, moved), are errdefs.ErrFailedPrecondition.
	MoveSandbox(ctx context.Context, id, from, to string) error
	// SetNodePools records node's ready pooled sandboxes by pool name, at
	// the store's now; Nodes returns them. An unknown node is
	// errdefs.ErrNotFound.
	SetNodePools(ctx context.Context, node string, ready map[string]int) error
}

// Reservation is what Store.Reserve is asked for one create.
type Reservation struct {
	Node  string
	Owner string
	// MemoryBytes is the create's memory limit, counted against
	// MaxMemoryBytes with the memory of the owner's other sandboxes.
	MemoryBytes int64
	// The owner's quota across the cluster; 0 is no limit.
	MaxSandboxes   int
	MaxMemoryBytes int64
}

// ErrOverQuota marks a reservation over its owner's quota (and is
// errdefs.ErrResourceExhausted too): no node can take it.
var ErrOverQuota = errors.New("quota")

// QuotaError is the error of a reservation by an owner who holds
// sandboxes (and reservations) with memory in all: nil within its
// quota.
func QuotaError(r Reservation, sandboxes int, memory int64) error {
	if r.MaxSandboxes > 0 && sandboxes+1 > r.MaxSandboxes {
		return fmt.Errorf("%w: at most %d concurrent sandboxes across the cluster: %w", ErrOverQuota, r.MaxSandboxes, errdefs.ErrResourceExhausted)
	}
	if r.MaxMemoryBytes > 0 && memory+r.MemoryBytes > r.MaxMemoryBytes {
		return fmt.Errorf("%w: at most %d MiB of sandbox memory in total across the cluster: %w", ErrOverQuota, r.MaxMemoryBytes>>20, errdefs.ErrResourceExhausted)
	}
	return nil
}

// SlotError is the error of a reservation on node, in state, with
// used of its slots taken: nil when it may take one more.
func SlotError(node, state string, slots, used int) error {
	if state != NodeLive {
		return fmt.Errorf("node %s is %s: %w", node, state, errdefs.ErrUnavailable)
	}
	if used >= slots {
		return fmt.Errorf("node %s is full (%d of %d slots): %w", node, used, slots, errdefs.ErrResourceExhausted)
	}
	return nil
}

// LostReason is the reason of a node marked lost and of its sandboxes.
func LostReason(node string, last time.Time, silence time.Duration) string {
	return "node " + node + " lost: no heartbeat for over " + silence.String() +
		" (last at " + last.UTC().Format(time.RFC3339) + ")"
}

// Active are the sandbox states that hold a slot on a node (every state
// but stopped and failed).
var Active = []string{"creating", "running", "paused", "stopping"}

// NewReservationID returns a fresh, random reservation id for
// Store.Reserve.
func NewReservationID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

// JSONLists returns n's runtimes, templates and builds as JSON arrays
// ("[]" for none), as both stores keep them.
func (n Node) JSONLists() (runtimes, templates, builds string) {
	enc := func(l []string) string {
		if l == nil {
			l = []string{}
		}
		b, _ := json.Marshal(l) // a []string always encodes
		return string(b)
	}
	return enc(n.Runtimes), enc(n.Templates), enc(n.Builds)
}

// DecodeJSON sets n's runtimes, templates and builds from the JSON
// arrays JSONLists made, and its pool report from the JSON object a
// store keeps (none: nil).
func (n *Node) DecodeJSON(runtimes, templates, builds, pools []byte) error {
	if err := json.Unmarshal(pools, &n.Pools); err != nil {
		return fmt.Errorf("decoding node %s pools: %w", n.Name, err)
	}
	if len(n.Pools) == 0 {
		n.Pools = nil
	}
	for _, l := range []struct {
		what string
		b    []byte
		dst  *[]string
	}{{"runtimes", runtimes, &n.Runtimes}, {"templates", templates, &n.Templates}, {"builds", builds, &n.Builds}} {
		if err := json.Unmarshal(l.b, l.dst); err != nil {
			return fmt.Errorf("decoding node %s %s: %w", n.Name, l.what, err)
		}
	}
	return nil
}
