package cluster_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kiln-sh/kiln/internal/cluster"
	"github.com/kiln-sh/kiln/internal/store/sqlite"
)

// TestClusterMetrics reads a real catalog (SQLite; PostgreSQL keeps the
// same registry, storetest checks both): two live nodes, one silent past
// the sweep, and the catalog gone.
func TestClusterMetrics(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "kiln.db"))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []cluster.Node{
		{Name: "node-a", URL: "http://a:8421", CPUs: 2, MemoryBytes: 8 << 30, Slots: 10, Runtimes: []string{"runc"}, StartedAt: time.Now()},
		{Name: "node-b", URL: "http://b:8421", CPUs: 2, MemoryBytes: 4 << 30, Slots: 5, Runtimes: []string{"runc"}, StartedAt: time.Now()},
	} {
		if _, err := st.Heartbeat(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(cluster.Collector(st))
	want := `
# HELP kiln_cluster_catalog_up 1 if the catalog answered this scrape's node query, else 0.
# TYPE kiln_cluster_catalog_up gauge
kiln_cluster_catalog_up 1
# HELP kiln_cluster_node_slots Sandboxes a node takes.
# TYPE kiln_cluster_node_slots gauge
kiln_cluster_node_slots{node="node-a"} 10
kiln_cluster_node_slots{node="node-b"} 5
# HELP kiln_cluster_nodes Registered nodes by state.
# TYPE kiln_cluster_nodes gauge
kiln_cluster_nodes{state="live"} 2
kiln_cluster_nodes{state="lost"} 0
`
	names := []string{"kiln_cluster_catalog_up", "kiln_cluster_node_slots", "kiln_cluster_nodes"}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
	time.Sleep(20 * time.Millisecond)
	if lost, err := st.MarkLost(ctx, time.Millisecond); err != nil || len(lost) != 2 {
		t.Fatalf("MarkLost = %v, %v; want both nodes", lost, err)
	}
	want = `
# HELP kiln_cluster_nodes Registered nodes by state.
# TYPE kiln_cluster_nodes gauge
kiln_cluster_nodes{state="live"} 0
kiln_cluster_nodes{state="lost"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kiln_cluster_nodes"); err != nil {
		t.Errorf("after the sweep: %v", err)
	}
	st.Close()
	want = `
# HELP kiln_cluster_catalog_up 1 if the catalog answered this scrape's node query, else 0.
# TYPE kiln_cluster_catalog_up gauge
kiln_cluster_catalog_up 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kiln_cluster_catalog_up", "kiln_cluster_nodes"); err != nil {
		t.Errorf("with the catalog closed: %v", err)
	}
}
