package cluster

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

var (
	catalogUpDesc  = prometheus.NewDesc("kiln_cluster_catalog_up", "1 if the catalog answered this scrape's node query, else 0.", nil, nil)
	nodesDesc      = prometheus.NewDesc("kiln_cluster_nodes", "Registered nodes by state.", []string{"state"}, nil)
	nodeSbDesc     = prometheus.NewDesc("kiln_cluster_node_sandboxes", "Sandboxes of a node that have not ended, from the catalog.", []string{"node"}, nil)
	nodeResDesc    = prometheus.NewDesc("kiln_cluster_node_reserved", "Placements reserved on a node and not yet released.", []string{"node"}, nil)
	nodeSlotsDesc  = prometheus.NewDesc("kiln_cluster_node_slots", "Sandboxes a node takes.", []string{"node"}, nil)
	nodeMemDesc    = prometheus.NewDesc("kiln_cluster_node_memory_allocated_bytes", "Memory limits of a node's sandboxes that have not ended.", []string{"node"}, nil)
	nodeMemCapDesc = prometheus.NewDesc("kiln_cluster_node_memory_bytes", "Memory a node reports.", []string{"node"}, nil)
)

// catalogBudget bounds one scrape's catalog query.
const catalogBudget = 5 * time.Second

// Collector is the node registry's view of the cluster, for a front's
// /metrics: nodes by state, and each node's load and capacity, read from
// the catalog at scrape time. Every front reports the same values:
// aggregate them with max, not sum.
func Collector(st Store) prometheus.Collector { return &clusterCollector{st: st} }

type clusterCollector struct{ st Store }

func (c *clusterCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{catalogUpDesc, nodesDesc, nodeSbDesc, nodeResDesc, nodeSlotsDesc, nodeMemDesc, nodeMemCapDesc} {
		ch <- d
	}
}

func (c *clusterCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), catalogBudget)
	defer cancel()
	nodes, err := c.st.Nodes(ctx)
	if err != nil {
		ch <- prometheus.MustNewConstMetric(catalogUpDesc, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(catalogUpDesc, prometheus.GaugeValue, 1)
	states := map[string]int{NodeLive: 0, NodeLost: 0}
	for _, n := range nodes {
		states[n.State]++
		ch <- prometheus.MustNewConstMetric(nodeSbDesc, prometheus.GaugeValue, float64(n.Sandboxes), n.Name)
		ch <- prometheus.MustNewConstMetric(nodeResDesc, prometheus.GaugeValue, float64(n.Reserved), n.Name)
		ch <- prometheus.MustNewConstMetric(nodeSlotsDesc, prometheus.GaugeValue, float64(n.Slots), n.Name)
		ch <- prometheus.MustNewConstMetric(nodeMemDesc, prometheus.GaugeValue, float64(n.AllocatedMemoryBytes), n.Name)
		ch <- prometheus.MustNewConstMetric(nodeMemCapDesc, prometheus.GaugeValue, float64(n.MemoryBytes), n.Name)
	}
	for state, count := range states {
		ch <- prometheus.MustNewConstMetric(nodesDesc, prometheus.GaugeValue, float64(count), state)
	}
}
