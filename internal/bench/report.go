package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// Section is one part of a report. Its exported fields go into the JSON
// report as they are; WriteMarkdown renders it for docs/benchmarks.md.
// A new benchmark is a function returning a Section, added to the report
// by cmd/kiln/bench.go under a flag.
type Section interface {
	WriteMarkdown(w io.Writer)
}

// Report is one run of kiln bench: when, on what host, the command that
// repeats it, and its sections in the order they ran.
type Report struct {
	When     time.Time
	Host     string
	Load     string // /proc/loadavg when the run started: a busy host skews everything
	Command  string
	sections []named
}

type named struct {
	name string
	s    Section
}

// NewReport starts a report for a run of command on this host.
func NewReport(command string) *Report {
	load, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(load))
	return &Report{When: time.Now().UTC(), Host: hostDesc(), Load: strings.Join(f[:min(3, len(f))], " "), Command: command}
}

// Add appends a section; name is its key in the JSON report.
func (r *Report) Add(name string, s Section) {
	r.sections = append(r.sections, named{name, s})
}

// MarshalJSON writes {when, host, command, sections: {name: section}}.
func (r *Report) MarshalJSON() ([]byte, error) {
	secs := make(map[string]Section, len(r.sections))
	for _, n := range r.sections {
		secs[n.name] = n.s
	}
	return json.Marshal(struct {
		When     time.Time          `json:"when"`
		Host     string             `json:"host"`
		Load     string             `json:"loadavg_at_start"`
		Command  string             `json:"command"`
		Sections map[string]Section `json:"sections"`
	}{r.When, r.Host, r.Load, r.Command, secs})
}

// WriteMarkdown writes the report as docs/benchmarks.md.
func (r *Report) WriteMarkdown(w io.Writer) {
	fmt.Fprintf(w, "# Benchmarks\n\nWritten by `kiln bench` on %s.\nHost: %s; load average at the start %s.\n", r.When.Format(time.RFC3339), r.Host, r.Load)
	fmt.Fprintf(w, "Repeat with `%s` (as root, after `make setup`; the JSON report has every number).\n", r.Command)
	fmt.Fprintf(w, "Numbers from one run on a shared, noisy VM; compare runs on the same machine only.\n")
	for _, n := range r.sections {
		n.s.WriteMarkdown(w)
	}
}

// targets are issue #2's goals on these 2-core machines.
var targets = map[string]struct{ create, exec time.Duration }{
	"runsc": {250 * time.Millisecond, 15 * time.Millisecond},
	"runc":  {100 * time.Millisecond, 5 * time.Millisecond},
}

// WriteMarkdown renders the latency and memory section.
func (r *Result) WriteMarkdown(w io.Writer) {
	fmt.Fprintf(w, "\n## Sandbox start and command latency\n\n")
	fmt.Fprintf(w, "| runtime | create → first `true` p50 | p95 | p99 | target p50 | `true` round trip p50 | p95 | p99 | target p50 | agent ping p50 | idle PSS / sandbox | idle cgroup RSS |\n")
	fmt.Fprintf(w, "|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, rr := range r.Runtimes {
		t := targets[rr.Runtime]
		fmt.Fprintf(w, "| %s | %s | %s | %s | ≤ %s | %s | %s | %s | ≤ %s | %s | %.1f MiB | %.1f MiB |\n", rr.Runtime,
			ms(rr.Create.P50), ms(rr.Create.P95), ms(rr.Create.P99), ms(t.create), ms(rr.Exec.P50), ms(rr.Exec.P95), ms(rr.Exec.P99), ms(t.exec),
			ms(rr.Ping.P50), float64(rr.IdlePSS)/(1<<20), float64(rr.IdleCgroup)/(1<<20))
	}
	if r.Floor.N > 0 {
		fmt.Fprintf(w, "| bubblewrap `true` (floor) | %s | %s | %s | | | | | | | | |\n", ms(r.Floor.P50), ms(r.Floor.P95), ms(r.Floor.P99))
	}
	fmt.Fprintf(w, "\nSamples: ")
	for _, rr := range r.Runtimes {
		fmt.Fprintf(w, "%s %d creates, %d round trips; ", rr.Runtime, rr.Create.N, rr.Exec.N)
	}
	fmt.Fprintf(w, "floor %d runs.\n\n", r.Floor.N)
	fmt.Fprintf(w, "- *create → first `true`*: `Manager.Create` (layer mount, bundle, runtime create+start, agent handshake) plus one command, as a user of `kiln run` feels it.\n")
	fmt.Fprintf(w, "- *round trip*: exec of `/bin/true` through the channel on a warm sandbox, start to exit event.\n")
	fmt.Fprintf(w, "- *agent ping*: the channel alone, no process.\n")
	fmt.Fprintf(w, "- *idle PSS*: proportional set size of all host processes in the sandbox's cgroup (for runsc: sentry and gofer, so gVisor's own overhead is included); shared pages are split fairly across sandboxes.\n")
	fmt.Fprintf(w, "- *channel micro-benchmark*: `go test -bench . ./internal/agent/channel` (pipe round trip without a sandbox).\n")
}

func ms(d time.Duration) string {
	if d == 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000)
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
