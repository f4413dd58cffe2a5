package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// ChurnResult is a create/kill loop and what it left behind.
type ChurnResult struct {
	Runtime  string        `json:"runtime"`
	Duration time.Duration `json:"duration_ns"`
	Cycles   int           `json:"cycles"`
	Errors   int           `json:"errors"`
	Create   Dist          `json:"create_first_true"`
	Kill     Dist          `json:"kill"`
	// Leaks are traces of the loop's own sandboxes left once it ended:
	// cgroups, mounts, loop devices, processes, runtime state, sandbox
	// dirs (their disk). Must be empty.
	Leaks []string `json:"leaks"`
	// Before and After are the baselines (this process's fds, goroutines,
	// live heap and child processes; the host's free disk and memory).
	Before, After Baseline `json:"-"`
	Deltas        Baseline `json:"deltas"` // After - Before
	Returned      bool     `json:"returned_to_baseline"`
	FirstError    string   `json:"first_error,omitempty"`
}

// Baseline is the state a churn run must return to.
type Baseline struct {
	FDs        int   `json:"fds"`
	Goroutines int   `json:"goroutines"`
	HeapBytes  int64 `json:"heap_bytes"`
	Children   int   `json:"children"`
	DiskFree   int64 `json:"disk_free_bytes"`
	MemAvail   int64 `json:"mem_available_bytes"`
}

// ChurnResults is the churn section.
type ChurnResults struct {
	Target  string        `json:"target"`
	Results []ChurnResult `json:"results"`
}

// Churn creates (with a first `true`) and kills sandboxes one after
// another on t for d per runtime, then checks that everything the loop's
// sandboxes had is gone and that this process and the host are back at
// their baseline. dataDir is the disk whose free space is tracked.
func Churn(ctx context.Context, t Target, runtimes []string, d time.Duration, dataDir string, progress io.Writer) (*ChurnResults, error) {
	res := &ChurnResults{Target: t.String()}
	_, inProcess := t.(managerTarget)
	for _, rt := range runtimes {
		fmt.Fprintf(progress, "bench: %s: churn for %s\n", rt, d)
		r := ChurnResult{Runtime: rt, Duration: d}
		r.Before = baseline(dataDir)
		var ids []string
		var creates, kills []time.Duration
		for end := time.Now().Add(d); time.Now().Before(end) && ctx.Err() == nil; {
			start := time.Now()
			id, err := t.Create(ctx, rt)
			if err == nil {
				creates = append(creates, time.Since(start))
			}
			if id != "" {
				ids = append(ids, id)
				start = time.Now()
				if kerr := t.Kill(context.WithoutCancel(ctx), id); kerr != nil && err == nil {
					err = kerr
				} else if kerr == nil {
					kills = append(kills, time.Since(start))
				}
			}
			r.Cycles++
			if err != nil {
				r.Errors++
				if r.FirstError == "" {
					r.FirstError = err.Error()
				}
			}
		}
		r.Create, r.Kill = dist(creates), dist(kills)
		time.Sleep(time.Second) // reaping and cgroup removal are asynchronous for the host
		r.After = baseline(dataDir)
		r.Leaks = Leftovers(ids, dataDir)
		b, a := r.Before, r.After
		r.Deltas = Baseline{FDs: a.FDs - b.FDs, Goroutines: a.Goroutines - b.Goroutines, HeapBytes: a.HeapBytes - b.HeapBytes,
			Children: a.Children - b.Children, DiskFree: a.DiskFree - b.DiskFree, MemAvail: a.MemAvail - b.MemAvail}
		// Free disk and memory are the host's, shared with whatever else
		// runs: reported, not judged (the sandbox dirs are, as leaks).
		r.Returned = len(r.Leaks) == 0 &&
			(!inProcess || (r.Deltas.FDs <= 2 && r.Deltas.Goroutines <= 5 && r.Deltas.Children <= 0 && r.Deltas.HeapBytes < 16<<20))
		res.Results = append(res.Results, r)
	}
	return res, ctx.Err()
}

// baseline measures this process and the host.
func baseline(dataDir string) Baseline {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	fds, _ := os.ReadDir("/proc/self/fd")
	return Baseline{FDs: len(fds), Goroutines: runtime.NumGoroutine(), HeapBytes: int64(ms.HeapAlloc),
		Children: children(), DiskFree: diskFree(dataDir), MemAvail: memAvailable()}
}

// children counts this process's child processes.
func children() int {
	self := strconv.Itoa(os.Getpid())
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	n := 0
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces; split after ')'.
		if i := bytes.LastIndexByte(b, ')'); i > 0 {
			if f := strings.Fields(string(b[i+1:])); len(f) > 1 && f[1] == self {
				n++
			}
		}
	}
	return n
}

// Leftovers lists what is left of the given (destroyed) sandboxes anywhere on
// the host, and their dirs under dataDir (a state dir is a child of it).
func Leftovers(ids []string, dataDir string) []string {
	out := []string{}
	if len(ids) == 0 {
		return out
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	loops, _ := exec.Command("losetup", "-a").Output()
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var procs [][]byte
	for _, p := range cmdlines {
		if b, err := os.ReadFile(p); err == nil {
			procs = append(procs, b)
		}
	}
	cgroups, _ := filepath.Glob("/sys/fs/cgroup/*/kiln/*")
	states, _ := filepath.Glob("/run/kiln/*/*")
	for _, id := range ids {
		if bytes.Contains(mounts, []byte(id)) {
			out = append(out, "mount of "+id)
		}
		if bytes.Contains(loops, []byte(id)) {
			out = append(out, "loop device of "+id)
		}
		for _, p := range procs {
			if bytes.Contains(p, []byte(id)) {
				out = append(out, "process of "+id)
				break
			}
		}
		dirs, _ := filepath.Glob(filepath.Join(dataDir, "*", id))
		for _, c := range append(append(cgroups, states...), dirs...) {
			if filepath.Base(c) == id {
				out = append(out, c)
			}
		}
	}
	return out
}

// WriteMarkdown renders the churn section.
func (r *ChurnResults) WriteMarkdown(w io.Writer) {
	fmt.Fprintf(w, "\n## Churn: create, `true`, kill in a loop\n\n")
	fmt.Fprintf(w, "Sandboxes created and killed one after another (%s); afterwards nothing of them may be left (cgroups, mounts, loop devices, processes, runtime state, sandbox dirs) and the process (fds, goroutines, live heap, children) must be back at its baseline; the host's free disk and memory are shown for reference (other work on the host moves them).\n\n", r.Target)
	fmt.Fprintf(w, "| runtime | duration | cycles | errors | create p50 | p99 | kill p50 | p99 | leaks | Δ fds | Δ goroutines | Δ heap | Δ children | Δ disk free | Δ MemAvailable | back to baseline |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, c := range r.Results {
		fmt.Fprintf(w, "| %s | %s | %d | %d | %s | %s | %s | %s | %d | %+d | %+d | %s | %+d | %s | %s | %v |\n", c.Runtime, c.Duration, c.Cycles, c.Errors,
			ms(c.Create.P50), ms(c.Create.P99), ms(c.Kill.P50), ms(c.Kill.P99), len(c.Leaks), c.Deltas.FDs, c.Deltas.Goroutines,
			mib(c.Deltas.HeapBytes), c.Deltas.Children, mib(c.Deltas.DiskFree), mib(c.Deltas.MemAvail), c.Returned)
	}
}
