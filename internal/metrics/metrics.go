// Package metrics holds Kiln's Prometheus collectors, on a private
// registry: sandboxes by state, create latency and errors, commands by how
// they ended, API latency by route, per-sandbox CPU and memory, template
// builds, and the Go runtime and process collectors.
package metrics

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// Source is what the sandbox collectors read; *sandbox.Manager is the one
// real implementation (tests use a fake, so no root is needed).
type Source interface {
	Live() []sandbox.Sandbox
	Usage(ctx context.Context, id sandbox.ID) (api.Usage, error)
}

var _ Source = (*sandbox.Manager)(nil)

// Metrics records what kiln serve does. A nil *Metrics records nothing.
type Metrics struct {
	reg           *prometheus.Registry
	createLatency prometheus.Histogram
	createErrors  *prometheus.CounterVec
	cmdStarted    prometheus.Counter
	cmdFinished   *prometheus.CounterVec
	reqLatency    *prometheus.HistogramVec
	ops           *opMetrics    // pause, resume, fork, snapshot (snapshot.go)
	build         *buildMetrics // template builds (templates.go)
}

// New registers the collectors; src may be nil (no sandbox gauges).
func New(src Source) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		createLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "kiln_sandbox_create_seconds", Help: "Time to create a sandbox, until its agent answers.",
			Buckets: []float64{.05, .1, .2, .3, .5, .75, 1, 1.5, 2, 3, 5, 10, 30},
		}),
		createErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kiln_sandbox_create_errors_total", Help: "Sandbox creations that failed, by error class.",
		}, []string{"class"}),
		cmdStarted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kiln_commands_started_total", Help: "Commands started through the API.",
		}),
		cmdFinished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kiln_commands_finished_total", Help: "Commands seen to end, by exit reason.",
		}, []string{"reason"}),
		reqLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kiln_http_request_duration_seconds", Help: "API request latency by route pattern and status class (streams: until they end).",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}, []string{"route", "code"}),
	}
	m.reg.MustRegister(m.createLatency, m.createErrors, m.cmdStarted, m.cmdFinished, m.reqLatency,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if src != nil {
		m.reg.MustRegister(&sandboxCollector{src: src})
	}
	m.ops = registerOps(m.reg)
	m.build = registerBuilds(m.reg)
	return m
}

// Registry returns the private registry, for tests and extra collectors.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// ObserveCreate records one sandbox creation; errClass is "" on success,
// else the api.ErrorCode of its error.
func (m *Metrics) ObserveCreate(d time.Duration, errClass string) {
	if m == nil {
		return
	}
	if errClass != "" {
		m.createErrors.WithLabelValues(errClass).Inc()
		return
	}
	m.createLatency.Observe(d.Seconds())
}

// CommandStarted counts a started command.
func (m *Metrics) CommandStarted() {
	if m != nil {
		m.cmdStarted.Inc()
	}
}

// CommandFinished counts a command that ended by its reason.
func (m *Metrics) CommandFinished(exit *api.ExitStatus) {
	if m != nil && exit != nil {
		m.cmdFinished.WithLabelValues(Reason(exit)).Inc()
	}
}

// Reason is the label for how a command ended: normal, timeout,
// out_of_memory, pids_limit, signaled or truncated.
func Reason(exit *api.ExitStatus) string {
	switch {
	case exit.Reason == api.ExitNormal && exit.Truncated, exit.Reason == api.ExitOutputLimit:
		return "truncated"
	case exit.Reason == api.ExitNormal:
		return "normal"
	}
	return string(exit.Reason)
}

// ObserveRequest records one API request by its route pattern and the
// class of its status ("2xx", "4xx", ...).
func (m *Metrics) ObserveRequest(route string, status int, d time.Duration) {
	if m != nil {
		m.reqLatency.WithLabelValues(route, strconv.Itoa(status/100)+"xx").Observe(d.Seconds())
	}
}

// sandboxCollector reads the Manager at scrape time.
type sandboxCollector struct{ src Source }

var (
	sandboxesDesc = prometheus.NewDesc("kiln_sandboxes", "Sandboxes of this node by state.", []string{"state"}, nil)
	cpuDesc       = prometheus.NewDesc("kiln_sandbox_cpu_seconds_total", "CPU time used by a live sandbox.", []string{"sandbox_id"}, nil)
	memDesc       = prometheus.NewDesc("kiln_sandbox_memory_bytes", "Memory used by a live sandbox.", []string{"sandbox_id"}, nil)
	states        = []sandbox.State{sandbox.StateCreating, sandbox.StateRunning, sandbox.StatePaused, sandbox.StateStopping, sandbox.StateStopped, sandbox.StateFailed}
)

// usageBudget bounds the time one scrape spends reading usage.
const usageBudget = 5 * time.Second

func (c *sandboxCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- sandboxesDesc
	ch <- cpuDesc
	ch <- memDesc
}

func (c *sandboxCollector) Collect(ch chan<- prometheus.Metric) {
	live := c.src.Live()
	counts := map[sandbox.State]int{}
	for _, sb := range live {
		counts[sb.State]++
	}
	for _, st := range states {
		ch <- prometheus.MustNewConstMetric(sandboxesDesc, prometheus.GaugeValue, float64(counts[st]), string(st))
	}
	ctx, cancel := context.WithTimeout(context.Background(), usageBudget)
	defer cancel()
	for _, sb := range live {
		if sb.State != sandbox.StateRunning || ctx.Err() != nil {
			continue
		}
		u, err := c.src.Usage(ctx, sb.ID)
		if err != nil {
			continue // it may have just ended
		}
		ch <- prometheus.MustNewConstMetric(cpuDesc, prometheus.CounterValue, u.CPUSeconds, sb.ID.String())
		ch <- prometheus.MustNewConstMetric(memDesc, prometheus.GaugeValue, float64(u.MemoryBytes), sb.ID.String())
	}
}
