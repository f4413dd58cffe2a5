package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kiln-sh/kiln/internal/sandbox"
)

// PoolSource reports the warm pools; *sandbox.Images is the one real
// implementation.
type PoolSource interface {
	PoolStats() []sandbox.PoolStat
}

// ImageSource reports the pools and snapshots: *sandbox.Images.
type ImageSource interface {
	PoolSource
	SnapshotSource
}

var _ ImageSource = (*sandbox.Images)(nil)

// RegisterImages adds the collectors of the pools and snapshots.
func (m *Metrics) RegisterImages(src ImageSource) {
	if m != nil {
		m.reg.MustRegister(&poolCollector{src: src}, &snapshotCollector{src: src})
	}
}

var (
	poolSizeDesc   = prometheus.NewDesc("kiln_pool_size", "Ready sandboxes in a template's pool.", []string{"template"}, nil)
	poolTargetDesc = prometheus.NewDesc("kiln_pool_target", "Ready sandboxes a template's pool is kept at: its configured size, or more while demand grows it (--pool-burst).", []string{"template"}, nil)
	poolHitsDesc   = prometheus.NewDesc("kiln_pool_hits_total", "Creates of a pooled template served from its pool.", []string{"template"}, nil)
	poolMissesDesc = prometheus.NewDesc("kiln_pool_misses_total", "Creates of a pooled template that found no compatible ready sandbox.", []string{"template"}, nil)
)

// poolCollector reads the pools at scrape time. Hit rate:
// rate(kiln_pool_hits_total) / (rate(hits) + rate(kiln_pool_misses_total)).
type poolCollector struct{ src PoolSource }

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- poolSizeDesc
	ch <- poolTargetDesc
	ch <- poolHitsDesc
	ch <- poolMissesDesc
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.src.PoolStats() {
		ch <- prometheus.MustNewConstMetric(poolSizeDesc, prometheus.GaugeValue, float64(s.Ready), s.Template)
		ch <- prometheus.MustNewConstMetric(poolTargetDesc, prometheus.GaugeValue, float64(s.Target), s.Template)
		ch <- prometheus.MustNewConstMetric(poolHitsDesc, prometheus.CounterValue, float64(s.Hits), s.Template)
		ch <- prometheus.MustNewConstMetric(poolMissesDesc, prometheus.CounterValue, float64(s.Misses), s.Template)
	}
}
