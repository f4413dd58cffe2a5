package metrics

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kiln-sh/kiln/internal/network"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// NetworkSource is what the network collector reads; *sandbox.Manager is
// the real one.
type NetworkSource interface {
	Live() []sandbox.Sandbox
	NetworkStats(ctx context.Context, id sandbox.ID) (network.Stats, error)
}

var _ NetworkSource = (*sandbox.Manager)(nil)

var (
	netSentDesc  = prometheus.NewDesc("kiln_sandbox_network_sent_bytes_total", "Bytes a networked sandbox sent.", []string{"sandbox_id"}, nil)
	netRecvDesc  = prometheus.NewDesc("kiln_sandbox_network_received_bytes_total", "Bytes a networked sandbox received.", []string{"sandbox_id"}, nil)
	netConnsDesc = prometheus.NewDesc("kiln_sandbox_network_connections_total", "Connections (flows) a networked sandbox opened.", []string{"sandbox_id"}, nil)
	netDropsDesc = prometheus.NewDesc("kiln_sandbox_network_policy_drops_total", "Packets a networked sandbox's egress policy or limits refused.", []string{"sandbox_id"}, nil)
)

// RegisterNetwork adds per-sandbox network counters, read at scrape time.
func (m *Metrics) RegisterNetwork(src NetworkSource) {
	if m != nil {
		m.reg.MustRegister(&networkCollector{src: src})
	}
}

type networkCollector struct{ src NetworkSource }

func (c *networkCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{netSentDesc, netRecvDesc, netConnsDesc, netDropsDesc} {
		ch <- d
	}
}

func (c *networkCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), usageBudget)
	defer cancel()
	for _, sb := range c.src.Live() {
		if sb.State != sandbox.StateRunning || ctx.Err() != nil {
			continue
		}
		st, err := c.src.NetworkStats(ctx, sb.ID)
		if err != nil {
			continue // no network, or it just ended
		}
		id := sb.ID.String()
		ch <- prometheus.MustNewConstMetric(netSentDesc, prometheus.CounterValue, float64(st.SentBytes), id)
		ch <- prometheus.MustNewConstMetric(netRecvDesc, prometheus.CounterValue, float64(st.ReceivedBytes), id)
		ch <- prometheus.MustNewConstMetric(netConnsDesc, prometheus.CounterValue, float64(st.Connections), id)
		ch <- prometheus.MustNewConstMetric(netDropsDesc, prometheus.CounterValue, float64(st.Drops), id)
	}
}
