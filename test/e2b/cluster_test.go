package e2b_test

import (
	"os"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/internal/servetest"
	"github.com/kiln-sh/kiln/internal/store/postgres/pgtest"
)

// PostgreSQL (the cluster's catalog) starts on the first pgtest.URL only,
// so the tests that use none pay nothing.
func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// TestStockSDKsThroughFront runs the pinned SDK's JS test files,
// unchanged, against one front of a cluster (docs/cluster.md): a
// PostgreSQL catalog, the front and two nodes as separate kiln serve
// processes, each node's sandbox networking in a test world of its own.
// Only the newest pinned SDK (latest/): the pair's older one and the
// newest release go through the same front code and would double the
// run, which TestStockSDKs already covers on one server.
func TestStockSDKsThroughFront(t *testing.T) {
	requireSuite(t)
	began := time.Now()
	c := servetest.StartCluster(t, servetest.Build(t), servetest.ClusterOptions{Store: pgtest.URL(t), Network: true})
	t.Logf("cluster up (kiln built, 1 front, 2 nodes) in %v", time.Since(began).Round(time.Millisecond))
	front := c.Fronts[0]
	began = time.Now()
	t.Run("sdk/latest", func(t *testing.T) { runSDK(t, "latest", front, nil) })
	t.Logf("the JS tests through the front took %v", time.Since(began).Round(time.Millisecond))
	if ids := front.Alive(t); len(ids) > 0 {
		t.Errorf("sandboxes left after the JS tests: %v", ids)
	}
}
