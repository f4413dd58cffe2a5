package metrics

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// buildMetrics are those of template builds; *Metrics is the builder's
// Observer (builder.Observer).
type buildMetrics struct {
	duration *prometheus.HistogramVec
	builds   *prometheus.CounterVec
	steps    *prometheus.CounterVec
	failures *prometheus.CounterVec
}

func registerBuilds(reg *prometheus.Registry) *buildMetrics {
	b := &buildMetrics{
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kiln_template_build_seconds", Help: "Time of template builds, by result (ready or error).",
			Buckets: []float64{1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600},
		}, []string{"result"}),
		builds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kiln_template_builds_total", Help: "Template builds that ended, by status (ready or error).",
		}, []string{"status"}),
		steps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kiln_template_build_steps_total", Help: "RUN, COPY and ADD steps of template builds that ended well, by whether their layer came from the cache; the cache hit rate is cached=\"true\" over the sum.",
		}, []string{"cached"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kiln_template_build_failures_total", Help: "Template builds that failed, by error class (cancelled: kiln serve stopped).",
		}, []string{"class"}),
	}
	reg.MustRegister(b.duration, b.builds, b.steps, b.failures)
	return b
}

// StepDone counts a layer step of a build that ended well.
func (m *Metrics) StepDone(cached bool) {
	if m == nil {
		return
	}
	label := "false"
	if cached {
		label = "true"
	}
	m.build.steps.WithLabelValues(label).Inc()
}

// BuildDone records a build that ended with status after d; err is why it
// failed.
func (m *Metrics) BuildDone(status string, d time.Duration, err error) {
	if m == nil {
		return
	}
	m.build.duration.WithLabelValues(status).Observe(d.Seconds())
	m.build.builds.WithLabelValues(status).Inc()
	if err != nil {
		class := string(errdefs.Code(err))
		if errors.Is(err, context.Canceled) {
			class = "cancelled"
		} else if errors.Is(err, context.DeadlineExceeded) {
			class = "timeout"
		}
		m.build.failures.WithLabelValues(class).Inc()
	}
}
