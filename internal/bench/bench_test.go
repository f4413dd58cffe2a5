package bench_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/internal/bench"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/sandbox/sandboxtest"
)

var agentPath string

func TestMain(m *testing.M) { os.Exit(sandboxtest.Main(m, &agentPath)) }

// TestReport runs the concurrency, density and churn benchmarks briefly
// on runc against a real Manager and checks the report: every section in
// the JSON and the markdown, churn back at its baseline with no leaks.
func TestReport(t *testing.T) {
	cfg := sandboxtest.Config(t, agentPath)
	m := sandboxtest.NewManager(t, cfg)
	ctx := context.Background()
	target := bench.Manager(m)
	rts := []string{"runc"}
	rep := bench.NewReport("kiln bench --test")

	conc, err := bench.Concurrency(ctx, target, rts, []int{1, 2}, 2, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	rep.Add("concurrency", conc)
	for _, r := range conc.Results {
		// Every part of a create costs CPU somewhere: the Manager, the
		// runtime's commands, the container's cgroup (its init, the agent).
		if r.CPU == nil || r.CPU.Kiln <= 0 || r.CPU.Commands <= 0 || r.CPU.Sandboxes <= 0 || r.Rate <= 0 {
			t.Errorf("concurrency %d: host CPU per create %+v, %.1f creates/s", r.Concurrency, r.CPU, r.Rate)
		}
		t.Logf("concurrency %d: host CPU per create %+v, %.1f creates/s", r.Concurrency, *r.CPU, r.Rate)
	}
	dens, err := bench.Density(ctx, target, rts, 1<<30, 3, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if dens[0].Created != 3 || dens[0].PSSBytes <= 0 || dens[0].Stopped != "cap" {
		t.Errorf("density: %+v", dens[0])
	}
	rep.Add("density", dens)
	churn, err := bench.Churn(ctx, target, rts, 3*time.Second, filepath.Dir(cfg.StateDir), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c := churn.Results[0]
	if c.Cycles == 0 || c.Errors != 0 || len(c.Leaks) != 0 || !c.Returned {
		t.Errorf("churn: %d cycles, %d errors (%s), leaks %v, deltas %+v", c.Cycles, c.Errors, c.FirstError, c.Leaks, c.Deltas)
	}
	rep.Add("churn", churn)

	var md bytes.Buffer
	rep.WriteMarkdown(&md)
	for _, want := range []string{"Repeat with `kiln bench --test`", "## Create latency under concurrency", "## Density", "## Churn"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("markdown lacks %q", want)
		}
	}
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Command  string                     `json:"command"`
		Sections map[string]json.RawMessage `json:"sections"`
	}
	if err := json.Unmarshal(b, &got); err != nil || got.Command != "kiln bench --test" || len(got.Sections) != 3 {
		t.Fatalf("JSON report: %s (%v)", b, err)
	}
	if !bytes.Contains(got.Sections["concurrency"], []byte(`"p95_ms"`)) {
		t.Errorf("concurrency section: %s", got.Sections["concurrency"])
	}
}

// TestDensitySteps adds idle runc sandboxes two at a time and checks each
// step measured the host: memory, threads, fds, the list's latency; and
// that they were all killed.
func TestDensitySteps(t *testing.T) {
	cfg := sandboxtest.Config(t, agentPath)
	m := sandboxtest.NewManager(t, cfg)
	ctx := context.Background()
	res, err := bench.DensitySteps(ctx, bench.Manager(m), bench.DensityStepsOptions{Runtime: "runc", Max: 4, Step: 2, Idle: time.Second}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Steps) != 2 || res.Stopped != "cap" || res.Steps[1].N != 4 {
		t.Fatalf("steps %+v, stopped %q; want 2 steps to 4 sandboxes, stopped by the cap", res.Steps, res.Stopped)
	}
	for _, s := range res.Steps {
		if s.PSSBytes <= 0 || s.Threads < 1 || s.FDs < 1 || s.ListP50 <= 0 || s.CreatesPerS <= 0 || s.MemAvailable <= 0 {
			t.Errorf("step %+v: a measure is missing", s)
		}
		t.Logf("%+v", s)
	}
	if live, _, err := m.List(ctx, sandbox.Filter{States: []sandbox.State{sandbox.StateRunning}}); err != nil || len(live) != 0 {
		t.Errorf("after the run: %d sandboxes left (%v)", len(live), err)
	}
	var md bytes.Buffer
	res.WriteMarkdown(&md)
	if !strings.Contains(md.String(), "| 4 |") {
		t.Errorf("markdown lacks the step of 4:\n%s", md.String())
	}
}
