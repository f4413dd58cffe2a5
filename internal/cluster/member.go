package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"os/exec"
	goruntime "runtime"
	"time"

	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/template"
)

// Member is a node of the cluster: what it tells the catalog about
// itself, and its sandboxes.
type Member struct {
	Nodes Store
	// Records are the catalog's sandbox records, Sandboxes the node's
	// Manager: a node back from lost ends the sandboxes the catalog
	// failed meanwhile.
	Records   sandbox.Store
	Sandboxes *sandbox.Manager
	// Self is the node's entry: name, URL, capacity (see Host). The
	// built-in templates and custom builds it has are read from DataDir
	// at each heartbeat.
	Self    Node
	DataDir string
	// Interval is the heartbeat's; Silence how long a node may go without
	// one before the sweep marks it lost.
	Interval, Silence time.Duration
	Log               *slog.Logger

	// Images holds the node's pools: their ready sandboxes are reported
	// to the catalog for placement, and with ClusterPools their sizes
	// follow the live nodes (pools.go): PoolSizes(LocalPools,
	// ClusterPools, live nodes), once PoolsAfter is closed. Without
	// ClusterPools the node starts its pools itself (LocalPools).
	Images                   *sandbox.Images
	LocalPools, ClusterPools map[string]int
	PoolsAfter               <-chan struct{}
}

// Host returns the entry of a node called name at url with slots on this
// host: its CPUs, memory, and the runtimes whose binaries it finds
// (runtimes maps a runtime's name to its binary).
func Host(name, url string, slots int, runtimes map[string]string) (Node, error) {
	total, _, err := Meminfo()
	if err != nil {
		return Node{}, fmt.Errorf("reading the host's memory: %w", err)
	}
	n := Node{Name: name, URL: url, CPUs: float64(goruntime.NumCPU()), MemoryBytes: total, Slots: slots,
		StartedAt: time.Now().UTC()}
	for _, rt := range []string{"runsc", "runc"} {
		if path, ok := runtimes[rt]; ok {
			if _, err := exec.LookPath(path); err == nil {
				n.Runtimes = append(n.Runtimes, rt)
			}
		}
	}
	return n, nil
}

// Join registers m's node in the catalog, then keeps its heartbeat and
// sweeps for lost nodes in the background until ctx ends. The Beat it
// returns drains the node.
func Join(ctx context.Context, m Member) (*Beat, error) {
	b, err := Heartbeat(ctx, m.Nodes, m.Interval, m.describe, m.endFailed, m.Log)
	if err != nil {
		return nil, err
	}
	go Sweep(ctx, m.Nodes, m.Interval, m.Silence, m.Log)
	if m.Images != nil {
		go m.keepPools(ctx)
	}
	return b, nil
}

// describe is the node's entry with the templates it has now (its
// built-ins, and the custom builds whose files it holds) and its data
// dir's disk space.
func (m Member) describe() Node {
	n := m.Self
	n.Templates, n.Builds = nil, template.Builds(m.DataDir)
	if total, free, err := Disk(m.DataDir); err == nil {
		n.DiskBytes, n.DiskFreeBytes = total, free
	}
	if ts, err := template.List(m.DataDir); err == nil {
		for _, t := range ts {
			n.Templates = append(n.Templates, t.Name)
		}
	}
	return n
}

// endFailed ends, with the catalog's reason, every sandbox the node runs
// whose record ended: the catalog failed them while the node was lost,
// and clients were told they are gone. A paused sandbox whose record
// names another node now (a front moved it there from the shared
// snapshot dir) is dropped here, its record left to that node.
func (m Member) endFailed(ctx context.Context) {
	for _, sb := range m.Sandboxes.Live() {
		rec, err := m.Records.GetSandbox(ctx, sb.ID)
		if err == nil && rec.Node != m.Self.Name && !rec.State.Terminal() {
			if err := m.Sandboxes.Disown(ctx, sb.ID); err != nil {
				m.Log.Warn("dropping a sandbox moved to another node", "sandbox_id", sb.ID, "node", rec.Node, "err", err)
			}
			continue
		}
		if err != nil || !rec.State.Terminal() {
			continue
		}
		if err := m.Sandboxes.Fail(ctx, sb.ID, rec.Reason); err != nil {
			m.Log.Warn("ending a sandbox the catalog failed", "sandbox_id", sb.ID, "err", err)
		}
	}
}
