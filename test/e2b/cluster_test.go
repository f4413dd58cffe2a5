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

// TestFrontStockSDKs runs the pinned SDKs' JS test files,
// unchanged, against one front of a cluster (docs/cluster.md): a
// PostgreSQL catalog, the front and two nodes as separate kiln serve
// processes, each node's sandbox networking in a test world of its own.
// Both pinned versions (latest/ and v1/, which uses E2B's v1 control
// plane), at once as TestStockSDKs runs them; not the newest release,
// which goes through the same routes and would add minutes.
func TestFrontStockSDKs(t *testing.T) {
	requireSuite(t)
	began := time.Now()
	c := servetest.StartCluster(t, servetest.Build(t), servetest.ClusterOptions{Store: pgtest.URL(t), Network: true})
	t.Logf("cluster up (kiln built, 1 front, 2 nodes) in %v", time.Since(began).Round(time.Millisecond))
	front := c.Fronts[0]
	began = time.Now()
	t.Run("sdk", func(t *testing.T) { runPinned(t, front, nil) })
	t.Logf("the JS tests through the front took %v", time.Since(began).Round(time.Millisecond))
	if ids := front.Alive(t); len(ids) > 0 {
		t.Errorf("sandboxes left after the JS tests: %v", ids)
	}
}
