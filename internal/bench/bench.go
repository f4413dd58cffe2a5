// Package bench measures what sandbox users feel: create-to-first-command
// latency, command round trip and idle memory per sandbox, per runtime,
// against bubblewrap as the floor for starting an isolated process here.
// kiln bench runs it and writes docs/benchmarks.md.
package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// Options control a run.
type Options struct {
	Runtimes []string
	Creates  int // sandboxes created (and killed) per runtime
	Execs    int // `true` round trips per runtime
	Idle     int // sandboxes kept idle at once to measure memory
	Rootfs   string
	Progress io.Writer
}

// Dist summarises samples. In JSON, durations are milliseconds.
type Dist struct {
	N                  int
	P50, P95, P99, Max time.Duration
}

func dist(s []time.Duration) Dist {
	if len(s) == 0 {
		return Dist{}
	}
	slices.Sort(s)
	q := func(p float64) time.Duration { return s[min(len(s)-1, int(p*float64(len(s))))] }
	return Dist{N: len(s), P50: q(0.50), P95: q(0.95), P99: q(0.99), Max: s[len(s)-1]}
}

// MarshalJSON writes the quantiles in milliseconds.
func (d Dist) MarshalJSON() ([]byte, error) {
	f := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	return json.Marshal(struct {
		N     int     `json:"n"`
		P50Ms float64 `json:"p50_ms"`
		P95Ms float64 `json:"p95_ms"`
		P99Ms float64 `json:"p99_ms"`
		MaxMs float64 `json:"max_ms"`
	}{d.N, f(d.P50), f(d.P95), f(d.P99), f(d.Max)})
}

// RuntimeResult is one runtime's numbers.
type RuntimeResult struct {
	Runtime    string `json:"runtime"`
	Create     Dist   `json:"create_first_true"` // Create returned and a first `true` completed
	Exec       Dist   `json:"true_round_trip"`   // `true` round trip on a warm sandbox
	Ping       Dist   `json:"agent_ping"`        // agent round trip without a process
	IdlePSS    int64  `json:"idle_pss_bytes"`
	IdleCgroup int64  `json:"idle_cgroup_rss_bytes"`
}

// Result is the latency and memory section: per runtime, and the
// bubblewrap floor.
type Result struct {
	Floor    Dist            `json:"bwrap_true_floor"` // bubblewrap `true`
	Runtimes []RuntimeResult `json:"runtimes"`
}

// Run measures every runtime in opts with m.
func Run(ctx context.Context, m *sandbox.Manager, opts Options) (*Result, error) {
	out := opts.Progress
	if out == nil {
		out = io.Discard
	}
	res := &Result{}
	if opts.Rootfs != "" {
		fmt.Fprintln(out, "bench: bubblewrap floor")
		d, err := bwrapFloor(ctx, opts.Rootfs, opts.Execs)
		if err != nil {
			fmt.Fprintln(out, "bench: bubblewrap floor skipped:", err)
		}
		res.Floor = d
	}
	for _, rt := range opts.Runtimes {
		r, err := runRuntime(ctx, m, rt, opts, out)
		if err != nil {
			return nil, fmt.Errorf("benchmarking %s: %w", rt, err)
		}
		res.Runtimes = append(res.Runtimes, r)
	}
	return res, nil
}

func runRuntime(ctx context.Context, m *sandbox.Manager, rt string, opts Options, out io.Writer) (RuntimeResult, error) {
	r := RuntimeResult{Runtime: rt}
	trueCmd := wire.ExecParams{Args: []string{"true"}}
	run := func(a *sandbox.Agent) error {
		exit, err := a.Exec(ctx, trueCmd, func(api.Event) error { return nil })
		if err == nil && exit.Code != 0 {
			err = fmt.Errorf("true exited %d", exit.Code)
		}
		return err
	}

	fmt.Fprintf(out, "bench: %s: %d creates\n", rt, opts.Creates)
	var creates []time.Duration
	for range opts.Creates {
		start := time.Now()
		sb, err := m.Create(ctx, sandbox.CreateOptions{Runtime: rt})
		if err != nil {
			return r, err
		}
		a, err := m.Agent(sb.ID)
		if err == nil {
			err = run(a)
		}
		creates = append(creates, time.Since(start))
		if kerr := m.Kill(ctx, sb.ID); err == nil {
			err = kerr
		}
		if err != nil {
			return r, err
		}
	}
	r.Create = dist(creates)

	fmt.Fprintf(out, "bench: %s: %d command round trips, %d idle sandboxes\n", rt, opts.Execs, opts.Idle)
	var ids []sandbox.ID
	defer func() {
		for _, id := range ids {
			_ = m.Kill(context.WithoutCancel(ctx), id)
		}
	}()
	for range max(1, opts.Idle) {
		sb, err := m.Create(ctx, sandbox.CreateOptions{Runtime: rt})
		if err != nil {
			return r, err
		}
		ids = append(ids, sb.ID)
	}
	a, err := m.Agent(ids[0])
	if err != nil {
		return r, err
	}
	var execs, pings []time.Duration
	for range opts.Execs {
		start := time.Now()
		if err := run(a); err != nil {
			return r, err
		}
		execs = append(execs, time.Since(start))
		start = time.Now()
		if err := a.Ping(ctx); err != nil {
			return r, err
		}
		pings = append(pings, time.Since(start))
	}
	r.Exec, r.Ping = dist(execs), dist(pings)

	time.Sleep(2 * time.Second) // let start-up garbage settle
	var pss, cg int64
	for _, id := range ids {
		p, c, err := sandboxMemory(id)
		if err != nil {
			return r, err
		}
		pss += p
		cg += c
	}
	r.IdlePSS, r.IdleCgroup = pss/int64(len(ids)), cg/int64(len(ids))
	return r, nil
}

// sandboxMemory returns the summed PSS of a sandbox's host processes (for
// runsc: sentry, gofer and everything they map) and its cgroup's rss.
func sandboxMemory(id sandbox.ID) (pss, rss int64, err error) {
	dir := filepath.Join("/sys/fs/cgroup/memory", "kiln", id.String())
	procs, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return 0, 0, fmt.Errorf("reading sandbox cgroup: %w", err)
	}
	for _, f := range strings.Fields(string(procs)) {
		pss += smapsField("/proc/"+f+"/smaps_rollup", "Pss:")
	}
	stat, _ := os.ReadFile(filepath.Join(dir, "memory.stat"))
	for _, l := range strings.Split(string(stat), "\n") {
		if v, ok := strings.CutPrefix(l, "total_rss "); ok {
			rss, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	return pss, rss, nil
}

func smapsField(path, key string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), key); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// bwrapFloor times a bubblewrap-sandboxed `true` on the template rootfs.
func bwrapFloor(ctx context.Context, rootfs string, n int) (Dist, error) {
	if _, err := exec.LookPath("bwrap"); err != nil {
		return Dist{}, err
	}
	var s []time.Duration
	for range n {
		start := time.Now()
		cmd := exec.CommandContext(ctx, "bwrap", "--ro-bind", rootfs, "/", "--proc", "/proc", "--dev", "/dev",
			"--unshare-all", "--die-with-parent", "/bin/true")
		if out, err := cmd.CombinedOutput(); err != nil {
			return Dist{}, fmt.Errorf("bwrap: %w: %s", err, out)
		}
		s = append(s, time.Since(start))
	}
	return dist(s), nil
}

func hostDesc() string {
	model := ""
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				model = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return fmt.Sprintf("%d cores (%s), kernel %s, %s", runtime.NumCPU(), model, strings.TrimSpace(string(kernel)), runtime.Version())
}

func memAvailable() int64 { return smapsField("/proc/meminfo", "MemAvailable:") }

func diskFree(dir string) int64 {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0
	}
	return int64(st.Bavail) * st.Bsize
}
