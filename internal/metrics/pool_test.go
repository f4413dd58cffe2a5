package metrics_test

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kiln-sh/kiln/internal/metrics"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// poolSource is an Images with pools (and no snapshots).
type poolSource struct {
	stats []sandbox.PoolStat
}

func (p poolSource) PoolStats() []sandbox.PoolStat { return p.stats }

func (p poolSource) SnapshotStats(context.Context) (sandbox.SnapshotStats, error) {
	return sandbox.SnapshotStats{}, nil
}

func TestPoolMetrics(t *testing.T) {
	m := metrics.New(fakeSource{})
	m.RegisterImages(poolSource{stats: []sandbox.PoolStat{
		{Template: "base", Ready: 3, Target: 4, Hits: 10, Misses: 2},
		{Template: "code-interpreter", Ready: 2, Target: 2},
	}})
	want := `
# HELP kiln_pool_hits_total Creates of a pooled template served from its pool.
# TYPE kiln_pool_hits_total counter
kiln_pool_hits_total{template="base"} 10
kiln_pool_hits_total{template="code-interpreter"} 0
# HELP kiln_pool_misses_total Creates of a pooled template that found no compatible ready sandbox.
# TYPE kiln_pool_misses_total counter
kiln_pool_misses_total{template="base"} 2
kiln_pool_misses_total{template="code-interpreter"} 0
# HELP kiln_pool_size Ready sandboxes in a template's pool.
# TYPE kiln_pool_size gauge
kiln_pool_size{template="base"} 3
kiln_pool_size{template="code-interpreter"} 2
# HELP kiln_pool_target Ready sandboxes a template's pool is kept at: its configured size, or more while demand grows it (--pool-burst).
# TYPE kiln_pool_target gauge
kiln_pool_target{template="base"} 4
kiln_pool_target{template="code-interpreter"} 2
`
	names := []string{"kiln_pool_hits_total", "kiln_pool_misses_total", "kiln_pool_size", "kiln_pool_target"}
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
	// A source without pools has no pool series.
	if n := testutil.CollectAndCount(metrics.New(fakeSource{}).Registry(), "kiln_pool_size"); n != 0 {
		t.Errorf("%d pool series without pools", n)
	}
}
