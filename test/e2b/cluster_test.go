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
// The newest pinned SDK (latest/) only: both pinned versions at once took
// 1m55s to 3m05s here through the front (latest/ alone 79 s), over the
// 3 minutes CI can spare for it; v1/ differs in the control-plane paths
// (POST /sandboxes, /sandboxes/{id}/connect), which the front routes by
// the same code (e2b.IsCreate, e2b.SandboxOfPath, unit-tested), and
// TestStockSDKs runs it, and the newest release, on one server.
func TestFrontStockSDKs(t *testing.T) {
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
