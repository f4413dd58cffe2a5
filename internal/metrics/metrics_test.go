package metrics_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/metrics"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// fakeSource stands in for the Manager so that no sandbox is needed.
type fakeSource struct{ live []sandbox.Sandbox }

func (f fakeSource) Live() []sandbox.Sandbox { return f.live }

func (f fakeSource) Usage(_ context.Context, id sandbox.ID) (api.Usage, error) {
	if id == "gone" {
		return api.Usage{}, errors.New("gone")
	}
	return api.Usage{CPUSeconds: 1.5, MemoryBytes: 1 << 20}, nil
}

func TestMetrics(t *testing.T) {
	m := metrics.New(fakeSource{live: []sandbox.Sandbox{
		{ID: "aaaaaaaa1", State: sandbox.StateRunning},
		{ID: "gone", State: sandbox.StateRunning},
		{ID: "ccccccccc", State: sandbox.StateStopping},
	}})
	m.ObserveCreate(120*time.Millisecond, "")
	m.ObserveCreate(time.Second, "resource_exhausted")
	m.CommandStarted()
	for _, e := range []api.ExitStatus{
		{}, {Code: 1}, {Reason: api.ExitTimeout}, {Reason: api.ExitOOM}, {Reason: api.ExitPidsLimit},
		{Reason: api.ExitSignaled}, {Truncated: true}, {Reason: api.ExitOutputLimit},
	} {
		m.CommandFinished(&e)
	}
	m.ObserveRequest("GET /v1/sandboxes", 200, time.Millisecond)
	m.ObserveRequest("GET /v1/sandboxes", 404, time.Millisecond)

	want := `
# HELP kiln_commands_finished_total Commands seen to end, by exit reason.
# TYPE kiln_commands_finished_total counter
kiln_commands_finished_total{reason="normal"} 2
kiln_commands_finished_total{reason="out_of_memory"} 1
kiln_commands_finished_total{reason="pids_limit"} 1
kiln_commands_finished_total{reason="signaled"} 1
kiln_commands_finished_total{reason="timeout"} 1
kiln_commands_finished_total{reason="truncated"} 2
# HELP kiln_sandbox_create_errors_total Sandbox creations that failed, by error class.
# TYPE kiln_sandbox_create_errors_total counter
kiln_sandbox_create_errors_total{class="resource_exhausted"} 1
# HELP kiln_sandbox_memory_bytes Memory used by a live sandbox.
# TYPE kiln_sandbox_memory_bytes gauge
kiln_sandbox_memory_bytes{sandbox_id="aaaaaaaa1"} 1.048576e+06
# HELP kiln_sandboxes Sandboxes of this node by state.
# TYPE kiln_sandboxes gauge
kiln_sandboxes{state="creating"} 0
kiln_sandboxes{state="failed"} 0
kiln_sandboxes{state="paused"} 0
kiln_sandboxes{state="running"} 2
kiln_sandboxes{state="stopped"} 0
kiln_sandboxes{state="stopping"} 1
`
	names := []string{"kiln_commands_finished_total", "kiln_sandbox_create_errors_total", "kiln_sandbox_memory_bytes", "kiln_sandboxes"}
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(m.Registry(), "kiln_http_request_duration_seconds"); n != 2 {
		t.Errorf("%d request series, want 2 (2xx and 4xx)", n)
	}
	if n := testutil.CollectAndCount(m.Registry(), "kiln_sandbox_create_seconds"); n != 1 {
		t.Errorf("create histogram: %d series", n)
	}
	if n := testutil.CollectAndCount(m.Registry(), "go_goroutines", "process_cpu_seconds_total"); n != 2 {
		t.Errorf("go/process collectors: %d series", n)
	}
}

func TestNilMetrics(t *testing.T) {
	var m *metrics.Metrics
	m.ObserveCreate(time.Second, "")
	m.CommandStarted()
	m.CommandFinished(&api.ExitStatus{})
	m.ObserveRequest("x", 200, time.Second)
}
