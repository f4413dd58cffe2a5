// Package process runs and tracks the processes a sandbox's agent starts
// on the host's behalf: each in its own process group (or session, for
// PTYs), with live, numbered output events, a bounded replay buffer for
// re-attaching, stdin, signals, timeouts that kill the whole tree, an
// output cap, and out-of-memory attribution.
//
// It runs inside the sandbox; it imports only the standard library,
// golang.org/x/sys and api.
package process

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kiln-sh/kiln/api"
)

// Defaults for Options fields left zero.
const (
	DefaultOutputLimit = 16 << 20
	DefaultReplayBytes = 1 << 20
	DefaultHistory     = 64
	// Ended processes beyond the most recent keepFull keep only
	// endedReplayBytes of replay, so the history costs the sandbox little
	// memory.
	keepFull         = 8
	endedReplayBytes = 64 << 10
	// maxInfoString bounds each argument and environment value in List.
	maxInfoString      = 1 << 10
	defaultOOMInterval = 30 * time.Millisecond
)

// Options configure a Table.
type Options struct {
	Log *slog.Logger
	// BaseEnv is the sandbox's environment that children inherit (beneath
	// the caller's variables); the agent strips its own KILN_* settings.
	BaseEnv []string
	// PathDir, if set, goes first on every process's PATH: the dir of
	// the agent's sudo client (package sudo).
	PathDir string
	// OutputLimit is the default cap on a process's stdout+stderr bytes.
	OutputLimit int64
	// ReplayBytes bounds each process's replay buffer.
	ReplayBytes int64
	// ReplayPool bounds the replay buffers of all processes together
	// (see replayPool); 0 means a sixteenth of MemoryLimit, within
	// 8–256 MiB (64 MiB if the limit is unknown).
	ReplayPool int64
	// History is how many ended processes are remembered.
	History int
	// ReapAll makes the table reap every child of this program with
	// wait4(-1): right for the agent as PID 1 or a child subreaper, wrong
	// for a program with other children (then each child is waited for
	// individually).
	ReapAll bool
	// MemoryLimit is the sandbox's memory limit in bytes (0: unknown). It
	// names the limit in out-of-memory messages and arms the OOM guard.
	MemoryLimit int64
	// OOMGuard enables the userspace OOM guard (see guard).
	OOMGuard bool
	// PidsLimit, if positive, is the sandbox's limit on the tasks of the
	// processes started through the table, enforced inside: for the agent
	// (ReapAll) without a PidsCgroup, i.e. under gVisor, with RLIMIT_NPROC
	// and a pids cgroup of the sentry (see sentryPids); and by the guard,
	// which kills the process tree with the most tasks when the limit is
	// reached, or when the whole sandbox has PidsLimit+backstopHeadroom
	// tasks (see guard).
	PidsLimit int64
	// PidsCgroup, if set, is the tasks file of the pids cgroup that
	// processes are started in (see forker); its pids.max is the limit and
	// the guard kills when its pids.events counts a refused fork.
	PidsCgroup string
	// MemoryUsage and OOMKills read the sandbox's memory use and the
	// kernel's OOM kill counter; nil means MemoryUsage and OOMKillCount.
	MemoryUsage func() (int64, error)
	OOMKills    func() (int64, bool)
	// OOMInterval is the guard's polling period (default 30ms).
	OOMInterval time.Duration
}

// Size is a terminal size.
type Size struct{ Cols, Rows uint16 }

// Spec describes a process to start.
type Spec struct {
	Args    []string          // argv; Args[0] is looked up in the child's PATH
	Env     map[string]string // the caller's variables, over the defaults
	Dir     string            // working directory; default the user's home
	User    User
	Tag     string
	Timeout time.Duration // 0: none
	// OutputLimit caps stdout+stderr bytes; 0 means the table's default.
	OutputLimit int64
	Stdin       bool  // keep stdin open for WriteStdin; else /dev/null
	PTY         *Size // run on a new terminal of this size
}

// Table is the set of processes started through the agent, running and
// recently ended.
type Table struct {
	opts    Options
	log     *slog.Logger
	reaper  *reaper
	baseEnv atomic.Pointer[[]string] // opts.BaseEnv until SetBaseEnv

	mu      sync.Mutex
	running map[int]*Process
	ended   []*Process // oldest first, at most opts.History

	spawned map[int]bool // running helpers started with Spawn

	replay *replayPool

	pids   *pidsCounter // nil: no pids limit of the table's own
	pidsMu sync.Mutex   // serialises checkPids

	busy      chan struct{} // 1-buffered: a process started
	stop      chan struct{}
	closeOnce sync.Once
}

// NewTable starts a table's reaper and, if enabled, its OOM guard.
func NewTable(o Options) *Table {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	o.OutputLimit = cmp.Or(o.OutputLimit, DefaultOutputLimit)
	o.ReplayBytes = cmp.Or(o.ReplayBytes, DefaultReplayBytes)
	o.History = cmp.Or(o.History, DefaultHistory)
	o.OOMInterval = cmp.Or(o.OOMInterval, defaultOOMInterval)
	if o.MemoryUsage == nil {
		o.MemoryUsage = MemoryUsage
	}
	if o.OOMKills == nil {
		o.OOMKills = OOMKillCount
	}
	t := &Table{
		opts:    o,
		log:     o.Log,
		reaper:  newReaper(o.ReapAll, o.Log),
		running: make(map[int]*Process),
		spawned: make(map[int]bool),
		replay:  &replayPool{budget: cmp.Or(o.ReplayPool, replayPoolSize(o.MemoryLimit))},
		busy:    make(chan struct{}, 1),
		stop:    make(chan struct{}),
	}
	t.baseEnv.Store(&o.BaseEnv)
	t.limitPids()
	if (o.OOMGuard && o.MemoryLimit > 0) || o.PidsLimit > 0 || t.pids != nil {
		go t.guard(o.OOMInterval)
	}
	return t
}

// limitPids sets up the pids limit: the forker that starts processes in
// their pids cgroup (the host's under runc; the sentry's, with
// RLIMIT_NPROC, under gVisor: see cgroup.go) and the counter the guard
// watches. For the agent (ReapAll) it first takes CAP_SYS_RESOURCE out of
// every thread's bounding set, so nothing it runs may hold it.
func (t *Table) limitPids() {
	o := t.opts
	if o.ReapAll {
		if err := dropBoundingSysResource(); err != nil {
			t.log.Warn("processes may gain CAP_SYS_RESOURCE", "err", err)
		}
	}
	tasks, sentry := o.PidsCgroup, false
	if tasks == "" && o.ReapAll && o.PidsLimit > 0 {
		var err error
		tasks, err = sentryPids(o.PidsLimit)
		sentry = tasks != ""
		if err != nil {
			t.log.Warn("the pids limit is enforced by the guard alone", "err", err)
		}
	}
	if tasks == "" {
		return
	}
	var setup func() error
	if o.ReapAll {
		setup = func() error { return forkerThreadSetup(sentry) }
	}
	f, err := newForker(tasks, setup)
	if err != nil {
		t.log.Warn("starting processes outside a pids cgroup of their own", "err", err)
		return
	}
	t.reaper.forker = f
	limit := int64(0)
	if sentry {
		limit = o.PidsLimit
	}
	t.pids = newPidsCounter(tasks, limit, 1)
}

// SetBaseEnv replaces the environment that processes started from now on
// inherit (Options.BaseEnv); running processes keep theirs.
func (t *Table) SetBaseEnv(env []string) {
	env = slices.Clone(env)
	t.baseEnv.Store(&env)
}

// Get returns a running or recently ended process.
func (t *Table) Get(pid int) (*Process, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p := t.running[pid]; p != nil {
		return p, nil
	}
	for i := len(t.ended) - 1; i >= 0; i-- {
		if t.ended[i].pid == pid {
			return t.ended[i], nil
		}
	}
	return nil, apiErrorf(api.CodeNotFound, "no process with pid %d", pid)
}

// List describes the running and recently ended processes, oldest first.
func (t *Table) List() []api.ProcessInfo {
	t.mu.Lock()
	ps := append(t.runningLocked(), t.ended...)
	t.mu.Unlock()
	out := make([]api.ProcessInfo, 0, len(ps))
	for _, p := range ps {
		out = append(out, abbreviate(p.Info()))
	}
	slices.SortStableFunc(out, func(a, b api.ProcessInfo) int { return a.StartedAt.Compare(b.StartedAt) })
	return out
}

// abbreviate shortens long arguments and environment values so that a
// listing stays small (the list travels in one channel frame).
func abbreviate(info api.ProcessInfo) api.ProcessInfo {
	cut := func(s string) string {
		if len(s) > maxInfoString {
			return s[:maxInfoString] + "…"
		}
		return s
	}
	args := make([]string, len(info.Args))
	for i, a := range info.Args {
		args[i] = cut(a)
	}
	info.Args = args
	if info.Env != nil {
		env := make(map[string]string, len(info.Env))
		for k, v := range info.Env {
			env[cut(k)] = cut(v)
		}
		info.Env = env
	}
	return info
}

func (t *Table) runningLocked() []*Process {
	ps := make([]*Process, 0, len(t.running))
	for _, p := range t.running {
		ps = append(ps, p)
	}
	return ps
}

func (t *Table) runningProcesses() []*Process {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.runningLocked()
}

func (t *Table) runningCount() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.running)
}

func (t *Table) add(p *Process) {
	t.mu.Lock()
	t.running[p.pid] = p
	t.mu.Unlock()
	t.wakeGuard()
}

// wakeGuard starts the guard's polling (a process or helper started).
func (t *Table) wakeGuard() {
	select {
	case t.busy <- struct{}{}:
	default:
	}
}

// finish moves an ended process to the history.
func (t *Table) finish(p *Process) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.running[p.pid] == p {
		delete(t.running, p.pid)
	}
	t.ended = append(t.ended, p)
	if i := len(t.ended) - 1 - keepFull; i >= 0 {
		t.ended[i].log.shrink(endedReplayBytes)
	}
	if n := len(t.ended) - t.opts.History; n > 0 {
		for _, old := range t.ended[:n] {
			old.log.release()
		}
		clear(t.ended[:n])
		t.ended = t.ended[n:]
	}
}

// Close terminates every running process: SIGTERM to each group, then,
// when ctx is done, SIGKILL to each tree. It stops the reaper and guard.
func (t *Table) Close(ctx context.Context) error {
	ps := t.runningProcesses()
	for _, p := range ps {
		_ = p.Signal("SIGTERM")
	}
	for _, p := range ps {
		select {
		case <-p.done:
		case <-ctx.Done():
			p.kill(exitCause{reason: api.ExitSignaled, message: "the agent shut down"})
		}
	}
	kill, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for _, p := range ps {
		select {
		case <-p.done:
		case <-kill.Done():
		}
	}
	t.closeOnce.Do(func() {
		close(t.stop)
		t.reaper.close()
	})
	return nil
}

func apiErrorf(code api.ErrorCode, format string, args ...any) *api.Error {
	return &api.Error{Code: code, Message: fmt.Sprintf(format, args...)}
}
