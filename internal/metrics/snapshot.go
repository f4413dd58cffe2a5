package metrics

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kiln-sh/kiln/internal/sandbox"
)

// SnapshotSource reports this node's snapshots; *sandbox.Images is the
// one real implementation.
type SnapshotSource interface {
	SnapshotStats(ctx context.Context) (sandbox.SnapshotStats, error)
}

var (
	snapshotsDesc     = prometheus.NewDesc("kiln_snapshots", "Snapshots kept on this node.", nil, nil)
	snapshotBytesDesc = prometheus.NewDesc("kiln_snapshot_bytes", "Disk space taken by this node's snapshots.", nil, nil)
)

// snapshotCollector reads the snapshot records at scrape time.
type snapshotCollector struct{ src SnapshotSource }

func (c *snapshotCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- snapshotsDesc
	ch <- snapshotBytesDesc
}

func (c *snapshotCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := c.src.SnapshotStats(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(snapshotBytesDesc, err)
		return
	}
	ch <- prometheus.MustNewConstMetric(snapshotsDesc, prometheus.GaugeValue, float64(st.Count))
	ch <- prometheus.MustNewConstMetric(snapshotBytesDesc, prometheus.GaugeValue, float64(st.Bytes))
}

// opMetrics time the lifecycle operations of snapshots and their kin:
// pause, resume, fork, snapshot.
type opMetrics struct {
	latency *prometheus.HistogramVec
	errors  *prometheus.CounterVec
}

// registerOps registers the operation metrics (the snapshot gauges come
// with RegisterImages).
func registerOps(reg *prometheus.Registry) *opMetrics {
	o := &opMetrics{
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kiln_sandbox_operation_seconds", Help: "Time of pause, resume, fork and snapshot operations through the API.",
			Buckets: []float64{.05, .1, .2, .3, .5, .75, 1, 1.5, 2, 3, 5, 10, 30, 60},
		}, []string{"op"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kiln_sandbox_operation_errors_total", Help: "Pause, resume, fork and snapshot operations that failed, by error class.",
		}, []string{"op", "class"}),
	}
	reg.MustRegister(o.latency, o.errors)
	return o
}

// ObserveOp records one operation (pause, resume, fork, snapshot);
// errClass is "" on success, else the api.ErrorCode of its error.
func (m *Metrics) ObserveOp(op string, d time.Duration, errClass string) {
	if m == nil {
		return
	}
	if errClass != "" {
		m.ops.errors.WithLabelValues(op, errClass).Inc()
		return
	}
	m.ops.latency.WithLabelValues(op).Observe(d.Seconds())
}
