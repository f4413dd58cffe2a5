package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// DensityStepsOptions configure the stepwise density run.
type DensityStepsOptions struct {
	Runtime string
	Max     int   // most sandboxes made
	Step    int   // sandboxes added between two measurements
	Floor   int64 // stop adding before MemAvailable would fall below this
	// Idle is how long the sandboxes are left alone at each step to
	// measure their idle host CPU.
	Idle time.Duration
}

// DensityStep is the host with N idle sandboxes.
type DensityStep struct {
	N int `json:"n"`
	// CreatesPerS is the step's creates over its wall time, one at a
	// time; CreateP50 their median.
	CreatesPerS float64       `json:"creates_per_s"`
	CreateP50   time.Duration `json:"create_p50_ns"`
	// Per sandbox: PSS of its host processes, host threads (its pids
	// cgroup's tasks), fds of its host processes, and host CPU while idle
	// (cpuacct over Idle) in milliseconds per second.
	PSSBytes    int64   `json:"pss_bytes_per_sandbox"`
	Threads     float64 `json:"threads_per_sandbox"`
	FDs         float64 `json:"fds_per_sandbox"`
	IdleCPUMsPS float64 `json:"idle_cpu_ms_per_s_per_sandbox"`
	// HostIdleCPU is every sandbox's idle CPU together, in cores.
	HostIdleCPU  float64       `json:"idle_cpu_cores"`
	ListP50      time.Duration `json:"list_p50_ns"`
	ListMax      time.Duration `json:"list_max_ns"`
	MemAvailable int64         `json:"mem_available_bytes"`
	Load1        string        `json:"load1"`
}

// DensityStepsResult is the stepwise density section.
type DensityStepsResult struct {
	Target  string              `json:"target"`
	Opts    DensityStepsOptions `json:"options"`
	Steps   []DensityStep       `json:"steps"`
	Stopped string              `json:"stopped"`
	// KillAll is how long killing them all took (8 at a time).
	KillAll time.Duration `json:"kill_all_ns"`
}

// DensitySteps adds idle sandboxes to t (on this host: they are measured
// through their cgroups) o.Step at a time up to o.Max, measuring the host
// after each step, and stops early when MemAvailable would fall below
// o.Floor with one more step or a create fails; then it kills them all.
func DensitySteps(ctx context.Context, t Target, o DensityStepsOptions, progress io.Writer) (*DensityStepsResult, error) {
	res := &DensityStepsResult{Target: t.String(), Opts: o, Stopped: "cap"}
	var ids []string
	defer func() {
		t0 := time.Now()
		killAll(context.WithoutCancel(ctx), t, ids)
		res.KillAll = time.Since(t0)
	}()
	mem0 := memAvailable()
	for len(ids) < o.Max && ctx.Err() == nil {
		// One more step must leave the floor: per sandbox as far as seen.
		if n := len(ids); n > 0 {
			per := (mem0 - memAvailable()) / int64(n)
			if memAvailable()-per*int64(o.Step)*3/2 < o.Floor {
				res.Stopped = "memory floor"
				break
			}
		}
		var lat []time.Duration
		t0 := time.Now()
		var err error
		for range min(o.Step, o.Max-len(ids)) {
			s := time.Now()
			var id string
			id, err = t.Create(ctx, o.Runtime)
			lat = append(lat, time.Since(s))
			if id != "" {
				ids = append(ids, id)
			}
			if err != nil {
				break
			}
		}
		wall := time.Since(t0)
		if err != nil {
			res.Stopped = "create failed: " + err.Error()
			break
		}
		st := measureStep(ctx, t, ids, o.Idle)
		st.CreatesPerS = float64(len(lat)) / wall.Seconds()
		st.CreateP50 = dist(lat).P50
		res.Steps = append(res.Steps, st)
		fmt.Fprintf(progress, "bench: density: %d sandboxes, %.1f creates/s, PSS %s each, %.0f threads, %.0f fds, idle %.2f ms/s each (%.2f cores), list p50 %s, MemAvailable %s, load %s\n",
			st.N, st.CreatesPerS, mib(st.PSSBytes), st.Threads, st.FDs, st.IdleCPUMsPS, st.HostIdleCPU, ms(st.ListP50), mib(st.MemAvailable), st.Load1)
	}
	return res, ctx.Err()
}

// measureStep measures the host with sandboxes ids idle.
func measureStep(ctx context.Context, t Target, ids []string, idle time.Duration) DensityStep {
	st := DensityStep{N: len(ids)}
	time.Sleep(time.Second) // let the last create's work settle
	cpu0, t0 := sandboxesCPU(ids), time.Now()
	time.Sleep(idle)
	cpu := sandboxesCPU(ids) - cpu0
	secs := time.Since(t0).Seconds()
	st.HostIdleCPU = cpu.Seconds() / secs
	st.IdleCPUMsPS = float64(cpu.Milliseconds()) / secs / float64(len(ids))
	var threads, fds int
	for _, id := range ids {
		threads += cgroupInt(filepath.Join("/sys/fs/cgroup/pids/kiln", id, "pids.current"))
		procs, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup/pids/kiln", id, "cgroup.procs"))
		for _, p := range strings.Fields(string(procs)) {
			// runsc's systrap stubs (no command line) share the Sentry's
			// fd table: counted once, with the Sentry.
			if cmd, _ := os.ReadFile("/proc/" + p + "/cmdline"); len(cmd) == 0 {
				continue
			}
			d, _ := os.ReadDir("/proc/" + p + "/fd")
			fds += len(d)
		}
	}
	st.Threads, st.FDs = float64(threads)/float64(len(ids)), float64(fds)/float64(len(ids))
	st.PSSBytes = totalPSS(ids) / int64(len(ids))
	var lat []time.Duration
	for range 10 {
		s := time.Now()
		if err := t.List(ctx); err == nil {
			lat = append(lat, time.Since(s))
		}
	}
	d := dist(lat)
	st.ListP50, st.ListMax = d.P50, d.Max
	st.MemAvailable = memAvailable()
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		st.Load1 = strings.Fields(string(b))[0]
	}
	return st
}

func cgroupInt(path string) int {
	b, _ := os.ReadFile(path)
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

// killAll kills ids, 8 at a time.
func killAll(ctx context.Context, t Target, ids []string) {
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for _, id := range ids {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			_ = t.Kill(ctx, id)
		})
	}
	wg.Wait()
}

// WriteMarkdown renders the stepwise density section.
func (r *DensityStepsResult) WriteMarkdown(w io.Writer) {
	fmt.Fprintf(w, "\n## Density: idle %s sandboxes, step by step\n\n", r.Opts.Runtime)
	fmt.Fprintf(w, "Idle sandboxes added %d at a time (one create at a time, %s), measured after each step; adding stops before MemAvailable would fall below %s. Stopped by: %s. Killing them all (8 at a time) took %.1f s.\n\n",
		r.Opts.Step, r.Target, mib(r.Opts.Floor), r.Stopped, r.KillAll.Seconds())
	fmt.Fprintf(w, "| sandboxes | creates/s (step) | create p50 | PSS per sandbox | threads per sandbox | fds per sandbox | idle CPU per sandbox | idle CPU, all | list p50 | list max | MemAvailable | load1 |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, s := range r.Steps {
		fmt.Fprintf(w, "| %d | %.1f | %s | %s | %.0f | %.0f | %.2f ms/s | %.2f cores | %s | %s | %s | %s |\n", s.N, s.CreatesPerS, ms(s.CreateP50),
			mib(s.PSSBytes), s.Threads, s.FDs, s.IdleCPUMsPS, s.HostIdleCPU, ms(s.ListP50), ms(s.ListMax), mib(s.MemAvailable), s.Load1)
	}
	fmt.Fprintf(w, "\n*Threads* are the tasks in the sandbox's pids cgroup (runsc: Sentry, gofer, systrap stubs); *fds* those of its host processes (runsc's systrap stubs share the Sentry's table and are not counted again); *idle CPU* is what its cgroup was charged over %s with nothing running in it, in ms of CPU per second; *list* is `List` of the first page (`GET /v1/sandboxes` with --server), 10 times at each step.\n", r.Opts.Idle)
}
