package metrics_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/metrics"
	"github.com/kiln-sh/kiln/internal/template/builder"
)

// *Metrics is what kiln serve gives the builder as its Observer.
var _ builder.Observer = (*metrics.Metrics)(nil)

func TestBuildMetrics(t *testing.T) {
	m := metrics.New(nil)
	m.StepDone(true)
	m.StepDone(true)
	m.StepDone(false)
	m.BuildDone("ready", 3*time.Second, nil)
	m.BuildDone("error", time.Second, fmt.Errorf("step 2 (RUN): exit 1: %w", errdefs.ErrFailedPrecondition))
	m.BuildDone("error", time.Second, context.Canceled)
	want := `
# HELP kiln_template_build_failures_total Template builds that failed, by error class (cancelled: kiln serve stopped).
# TYPE kiln_template_build_failures_total counter
kiln_template_build_failures_total{class="cancelled"} 1
kiln_template_build_failures_total{class="failed_precondition"} 1
# HELP kiln_template_build_steps_total RUN, COPY and ADD steps of template builds that ended well, by whether their layer came from the cache; the cache hit rate is cached="true" over the sum.
# TYPE kiln_template_build_steps_total counter
kiln_template_build_steps_total{cached="false"} 1
kiln_template_build_steps_total{cached="true"} 2
# HELP kiln_template_builds_total Template builds that ended, by status (ready or error).
# TYPE kiln_template_builds_total counter
kiln_template_builds_total{status="error"} 2
kiln_template_builds_total{status="ready"} 1
`
	names := []string{"kiln_template_build_failures_total", "kiln_template_build_steps_total", "kiln_template_builds_total"}
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(m.Registry(), "kiln_template_build_seconds"); n != 2 {
		t.Errorf("kiln_template_build_seconds has %d series, want 2 (ready, error)", n)
	}
	var nilM *metrics.Metrics // records nothing, and does not panic
	nilM.StepDone(true)
	nilM.BuildDone("ready", time.Second, nil)
}
