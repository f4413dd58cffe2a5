package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// SnapshotResult is pause, resume, fork and snapshot latency on runsc
// against the working set a sandbox holds in memory.
type SnapshotResult struct {
	Samples int            `json:"samples"`
	Sizes   []SnapshotSize `json:"sizes"`
}

// SnapshotSize is one working-set size's numbers.
type SnapshotSize struct {
	WorkingSet  int64 `json:"working_set_bytes"` // random bytes a Python process holds
	MemoryLimit int64 `json:"memory_limit_bytes"`
	Pause       Dist  `json:"pause"`        // Manager.Pause: checkpoint to disk, container destroyed
	Resume      Dist  `json:"resume"`       // Manager.Resume: restore and a new agent session
	ResumeFirst Dist  `json:"resume_first"` // resume → first `true` done
	Fork1       Dist  `json:"fork_1"`       // Images.Fork into 1, all running
	Fork4       Dist  `json:"fork_4"`       // Images.Fork into 4, all running
	Fork16      Dist  `json:"fork_16"`      // Images.Fork into 16, all running
	// Fork16Memory is the memory the 16 forks' cgroups hold once all run
	// (summed), and Fork16HostDrop how much the host's MemAvailable fell.
	Fork16Memory   int64 `json:"fork_16_memory_bytes"`
	Fork16HostDrop int64 `json:"fork_16_host_drop_bytes"`
	Snapshot       Dist  `json:"snapshot"`       // Images.Snapshot (source keeps running)
	SnapshotBytes  int64 `json:"snapshot_bytes"` // disk a snapshot takes (memory image + written disk blocks)
	FromSnapshot   Dist  `json:"from_snapshot"`  // Create{Snapshot}, running
}

// SnapshotOptions configure Snapshots.
type SnapshotOptions struct {
	Sizes   []int64 // working sets to measure
	Samples int     // per operation and size (forks: at most 2)
	// Fork4Max is the largest working set forked into 4 (memory: 5x it),
	// Fork16Max the largest forked into 16 (17x; one sample).
	Fork4Max, Fork16Max int64
}

// Snapshots measures pause, resume, fork and snapshot of runsc sandboxes
// holding each working set (random bytes, so the memory image cannot be
// compressed away).
func Snapshots(ctx context.Context, m *sandbox.Manager, im *sandbox.Images, o SnapshotOptions, progress io.Writer) (*SnapshotResult, error) {
	r := &SnapshotResult{Samples: o.Samples}
	for _, ws := range o.Sizes {
		fmt.Fprintf(progress, "bench: snapshots with a %s working set\n", mib(ws))
		s, err := snapshotSize(ctx, m, im, ws, o)
		if err != nil {
			return nil, fmt.Errorf("working set %s: %w", mib(ws), err)
		}
		r.Sizes = append(r.Sizes, *s)
	}
	return r, nil
}

func snapshotSize(ctx context.Context, m *sandbox.Manager, im *sandbox.Images, ws int64, o SnapshotOptions) (_ *SnapshotSize, err error) {
	s := &SnapshotSize{WorkingSet: ws, MemoryLimit: (ws + ws/4 + 256<<20) >> 20 << 20}
	sb, err := m.Create(ctx, sandbox.CreateOptions{Template: "base", Runtime: "runsc", Timeout: time.Hour,
		Limits: sandbox.Limits{MemoryBytes: s.MemoryLimit}})
	if err != nil {
		return nil, err
	}
	kill := func(ids ...sandbox.ID) {
		for _, id := range ids {
			_ = m.Kill(context.WithoutCancel(ctx), id)
		}
	}
	defer kill(sb.ID)
	if err := holdWorkingSet(ctx, m, sb.ID, ws); err != nil {
		return nil, err
	}

	var pause, resume, first []time.Duration
	for range o.Samples {
		t0 := time.Now()
		if _, err := m.Pause(ctx, sb.ID); err != nil {
			return nil, fmt.Errorf("pause: %w", err)
		}
		pause = append(pause, time.Since(t0))
		// A paused sandbox sits a while before its resume (with
		// KILN_RESUME_READY its container is created again meanwhile).
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
		t0 = time.Now()
		if _, err := m.Resume(ctx, sb.ID); err != nil {
			return nil, fmt.Errorf("resume: %w", err)
		}
		resume = append(resume, time.Since(t0))
		if err := runTrue(ctx, m, sb.ID); err != nil {
			return nil, fmt.Errorf("after resume: %w", err)
		}
		first = append(first, time.Since(t0))
	}
	s.Pause, s.Resume, s.ResumeFirst = dist(pause), dist(resume), dist(first)

	// forks forks into n, samples times, and calls measure (if any) on
	// each set of forks while they all run.
	forks := func(n, samples int, measure func([]sandbox.Sandbox)) (Dist, error) {
		var ds []time.Duration
		for range samples {
			t0 := time.Now()
			sbs, err := im.Fork(ctx, sb.ID, n, sandbox.Quota{})
			if err != nil {
				return Dist{}, fmt.Errorf("fork into %d: %w", n, err)
			}
			ds = append(ds, time.Since(t0))
			if measure != nil {
				measure(sbs)
			}
			for _, f := range sbs {
				kill(f.ID)
			}
		}
		return dist(ds), nil
	}
	if s.Fork1, err = forks(1, min(o.Samples, 2), nil); err != nil {
		return nil, err
	}
	if ws <= o.Fork4Max {
		if s.Fork4, err = forks(4, min(o.Samples, 2), nil); err != nil {
			return nil, err
		}
	}
	if ws <= o.Fork16Max {
		before := memAvailable()
		s.Fork16, err = forks(16, 1, func(sbs []sandbox.Sandbox) {
			s.Fork16HostDrop = before - memAvailable()
			for _, f := range sbs {
				if u, err := m.Usage(ctx, f.ID); err == nil {
					s.Fork16Memory += u.MemoryBytes
				}
			}
		})
		if err != nil {
			return nil, err
		}
	}

	var snaps, creates []time.Duration
	for i := range min(o.Samples, 2) {
		name := fmt.Sprintf("bench-%d-%d", ws>>20, i)
		t0 := time.Now()
		snap, err := im.Snapshot(ctx, sb.ID, name)
		if err != nil {
			return nil, fmt.Errorf("snapshot: %w", err)
		}
		snaps = append(snaps, time.Since(t0))
		s.SnapshotBytes = snap.SizeBytes
		defer im.DeleteSnapshot(context.WithoutCancel(ctx), "", name)
	}
	for range o.Samples {
		t0 := time.Now()
		c, err := m.Create(ctx, sandbox.CreateOptions{Snapshot: fmt.Sprintf("bench-%d-0", ws>>20)})
		if err != nil {
			return nil, fmt.Errorf("create from snapshot: %w", err)
		}
		creates = append(creates, time.Since(t0))
		kill(c.ID)
	}
	s.Snapshot, s.FromSnapshot = dist(snaps), dist(creates)
	return s, nil
}

// holdWorkingSet starts a Python process in the sandbox that holds n
// random bytes, and returns once it holds them.
func holdWorkingSet(ctx context.Context, m *sandbox.Manager, id sandbox.ID, n int64) error {
	a, err := m.Agent(id)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	code := fmt.Sprintf("import os, time\nb = os.urandom(%d)\nprint('ready', flush=True)\ntime.sleep(86400)", n)
	ready := errors.New("ready")
	var out strings.Builder
	var once sync.Once
	_, err = a.Exec(ctx, wire.ExecParams{Args: []string{"python3", "-c", code}, Tag: "working-set"}, func(ev api.Event) error {
		out.Write(ev.Data)
		if strings.Contains(out.String(), "ready") {
			var e error
			once.Do(func() { e = ready })
			return e // detach; the process holds on
		}
		return nil
	})
	if errors.Is(err, ready) {
		return nil
	}
	return fmt.Errorf("holding the working set: %v (output %q)", err, out.String())
}

// runTrue runs `true` in a sandbox.
func runTrue(ctx context.Context, m *sandbox.Manager, id sandbox.ID) error {
	a, err := m.Agent(id)
	if err != nil {
		return err
	}
	exit, err := a.Exec(ctx, wire.ExecParams{Args: []string{"true"}, TimeoutMs: 30_000}, func(api.Event) error { return nil })
	if err == nil && (exit == nil || exit.Code != 0) {
		err = fmt.Errorf("true exited %+v", exit)
	}
	return err
}

// WriteMarkdown renders the section for docs/benchmarks.md.
func (r *SnapshotResult) WriteMarkdown(w io.Writer) {
	fmt.Fprintf(w, "\n## Pause, resume, fork and snapshots (runsc)\n\n")
	fmt.Fprintf(w, "`kiln bench --snapshots`: a `base` sandbox whose Python process holds the working set "+
		"(random bytes, incompressible); %d samples per operation (forks and snapshots: up to 2). p50 (max).\n\n", r.Samples)
	fmt.Fprintf(w, "| working set | pause | resume | resume → first `true` | fork into 1 | fork into 4 | fork into 16 | snapshot | create from snapshot | snapshot size | memory of 16 forks (cgroups) | host MemAvailable drop |\n")
	fmt.Fprintf(w, "|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	pm := func(d Dist) string {
		if d.N == 0 {
			return "–"
		}
		return fmt.Sprintf("%s (%s)", ms(d.P50), ms(d.Max))
	}
	mem := func(s SnapshotSize, b int64) string {
		if s.Fork16.N == 0 {
			return "–"
		}
		return mib(b)
	}
	for _, s := range r.Sizes {
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", mib(s.WorkingSet), pm(s.Pause), pm(s.Resume), pm(s.ResumeFirst),
			pm(s.Fork1), pm(s.Fork4), pm(s.Fork16), pm(s.Snapshot), pm(s.FromSnapshot), mib(s.SnapshotBytes),
			mem(s, s.Fork16Memory), mem(s, s.Fork16HostDrop))
	}
	fmt.Fprintf(w, "\nTargets: resume of a sandbox of ≤ 256 MB ≤ 300 ms; fork into 4 ≤ 1 s. E2B publishes pause ≈ 4 s per GiB and resume ≈ 1 s.\n\n")
	fmt.Fprintf(w, "- *pause*: freeze, `runsc checkpoint` of memory and processes to the sandbox's dir, container destroyed (memory freed).\n")
	fmt.Fprintf(w, "- *resume*: `runsc restore` from that image and a new agent session, a second after the pause; *→ first `true`* adds one command.\n")
	fmt.Fprintf(w, "- *fork into N*: freeze, a sparse copy of the disk, checkpoint with `--leave-running` while the N forks' containers are created, thaw, then N restores in parallel into them; until all N run.\n")
	fmt.Fprintf(w, "- *snapshot*: the same image, kept under a name (the source runs on); *create from snapshot*: one restore of it.\n")
	fmt.Fprintf(w, "- *memory of 16 forks*: their memory cgroups' usage summed, and the fall of the host's MemAvailable, once all 16 run: "+
		"gVisor copies the image into each fork's own memory (no page is shared between forks; docs/gvisor-notes.md).\n")
}
