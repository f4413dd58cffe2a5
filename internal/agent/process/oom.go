package process

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kiln-sh/kiln/api"
)

// Where a runc container sees its own memory cgroup.
const (
	cgroupV1Memory = "/sys/fs/cgroup/memory/"
	cgroupV2       = "/sys/fs/cgroup/"
)

// OOMKillCount reads the kernel's count of OOM kills in the sandbox's
// memory cgroup (v1 memory.oom_control, v2 memory.events). ok is false
// where no such counter is visible (e.g. under gVisor).
func OOMKillCount() (n int64, ok bool) {
	for _, f := range []string{cgroupV1Memory + "memory.oom_control", cgroupV2 + "memory.events"} {
		if v, err := readKeyed(f, "oom_kill"); err == nil {
			return v, true
		}
	}
	return 0, false
}

// MemoryUsage reports the sandbox's memory use in bytes, not counting
// reclaimable page cache: from the memory cgroup where visible (runc),
// else /proc/meminfo's MemTotal-MemAvailable (gVisor reports the
// sandbox's own memory there).
func MemoryUsage() (int64, error) {
	if u, err := readInt(cgroupV1Memory + "memory.usage_in_bytes"); err == nil {
		inactive, _ := readKeyed(cgroupV1Memory+"memory.stat", "total_inactive_file")
		return max(u-inactive, 0), nil
	}
	if u, err := readInt(cgroupV2 + "memory.current"); err == nil {
		inactive, _ := readKeyed(cgroupV2+"memory.stat", "inactive_file")
		return max(u-inactive, 0), nil
	}
	total, err := readKeyed("/proc/meminfo", "MemTotal:")
	if err != nil {
		return 0, fmt.Errorf("reading memory usage: %w", err)
	}
	avail, err := readKeyed("/proc/meminfo", "MemAvailable:")
	if err != nil {
		return 0, fmt.Errorf("reading memory usage: %w", err)
	}
	return (total - avail) << 10, nil // meminfo is in KiB
}

func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// readKeyed finds "key value" in a file of such lines.
func readKeyed(path, key string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == key {
			return strconv.ParseInt(f[1], 10, 64)
		}
	}
	return 0, errors.New(key + " not found in " + path)
}

// oomMargin is how far below the limit the guard acts: the kernel or the
// host would kill at the limit itself, so the guard must win the race.
func oomMargin(limit int64) int64 {
	return min(limit/16, 64<<20)
}

// backstopHeadroom is how many tasks beyond the pids limit the guard's
// whole-sandbox count tolerates (the agent's own threads, and root's
// processes that left the user cgroup) before it kills.
const backstopHeadroom = 64

// backstopEvery is how many guard ticks pass between whole-sandbox task
// counts (each reads every process's /proc entry).
const backstopEvery = 32

// guard is the userspace resource guard. While any process or spawned
// helper runs it polls
// every interval and SIGKILLs the offending tree:
//   - the pids limit hit (see pidsCounter.hit: a fork refused by the
//     kernel's pids cgroup, or, inside gVisor, the processes holding all
//     but one of their tasks): the tree with the most tasks, marked
//     pids_limit (checkPids);
//   - for gVisor, where the host's cgroup can only kill the whole sandbox:
//     memory above the limit minus a margin: the tree with the largest RSS
//     among processes started through the API (marked out_of_memory) and
//     helpers the table spawned (code kernels, which end); and
//     more tasks in the whole sandbox than the limit plus headroom, counted
//     every backstopEvery ticks (root may move its processes out of the
//     user cgroup).
func (t *Table) guard(interval time.Duration) {
	o := t.opts
	memory := o.OOMGuard && o.MemoryLimit > 0
	threshold := o.MemoryLimit - oomMargin(o.MemoryLimit)
	for {
		select {
		case <-t.stop:
			return
		case <-t.busy:
		}
		tick := time.NewTicker(interval)
		for n := 0; t.runningCount() > 0 || t.spawnedCount() > 0; n++ {
			select {
			case <-t.stop:
				tick.Stop()
				return
			case <-tick.C:
			}
			if t.checkPids(true) {
				continue
			}
			var victim *Process
			var cause exitCause
			if o.PidsLimit > 0 && n%backstopEvery == 0 {
				if tasks, busiest, _ := t.busiest(); tasks > o.PidsLimit+backstopHeadroom && busiest != nil {
					victim = busiest
					t.log.Warn("pids limit reached: killing the process tree with the most tasks", "pid", victim.pid, "tasks", tasks, "limit", o.PidsLimit)
					cause = t.pidsCause()
				}
			}
			if used, err := o.MemoryUsage(); victim == nil && memory && err == nil && used > threshold {
				p, root := t.largest()
				switch {
				case p != nil:
					victim = p
					t.log.Warn("memory limit reached: killing the largest process", "pid", victim.pid, "usage", used, "limit", o.MemoryLimit)
					cause = oomReason(o.MemoryLimit)
				case root > 0:
					// A code kernel: its context ends with it.
					t.log.Warn("memory limit reached: killing the largest helper", "pid", root, "usage", used, "limit", o.MemoryLimit)
					killTree(root)
					t.settleSpawned(root)
				}
			}
			if victim == nil {
				continue
			}
			victim.kill(cause)
			t.settle(victim)
		}
		tick.Stop()
	}
}

// settleSpawned waits, up to a second, until the killed helper root has
// been reaped, so its memory is freed before the next check.
func (t *Table) settleSpawned(root int) {
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		t.mu.Lock()
		alive := t.spawned[root]
		t.mu.Unlock()
		if !alive {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// settle gives the kernel time to free a killed process's resources.
func (t *Table) settle(victim *Process) {
	select {
	case <-victim.done:
	case <-time.After(time.Second):
	case <-t.stop:
	}
}

// checkPids kills the tree with the most tasks if the pids limit was hit,
// and reports whether it killed. It runs on the guard's ticks and when a
// process ends (so that a process that ends right after the limit refused
// its fork is reported as pids_limit); settle waits for the victim.
func (t *Table) checkPids(settle bool) bool {
	if t.pids == nil {
		return false
	}
	t.pidsMu.Lock()
	defer t.pidsMu.Unlock()
	if !t.pids.hit() {
		return false
	}
	var tasks int64
	var p *Process
	var root int
	if ps := t.runningProcesses(); len(ps) == 1 && t.spawnedCount() == 0 {
		// One suspect: no need to read every process's /proc entry while
		// a bomb leaves the agent little CPU.
		p = ps[0]
		tasks, _ = t.pids.current()
	} else {
		tasks, p, root = t.busiest()
	}
	cause := t.pidsCause()
	switch {
	case p != nil:
		t.log.Warn("pids limit reached: killing the process tree with the most tasks", "pid", p.pid, "tasks", tasks, "limit", t.pids.limit)
		p.kill(cause)
		if settle {
			t.settle(p)
		}
	case root > 0:
		// A kernel, or what a process that has ended left running.
		t.log.Warn("pids limit reached: killing the process tree with the most tasks", "root", root, "tasks", tasks, "limit", t.pids.limit)
		killTree(root)
	default:
		return false
	}
	return true
}

func (t *Table) spawnedCount() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.spawned)
}

func (t *Table) pidsCause() exitCause {
	limit := t.opts.PidsLimit
	if t.pids != nil && t.pids.limit > 0 {
		limit = t.pids.limit
	}
	return exitCause{reason: api.ExitPidsLimit, message: fmt.Sprintf(
		"too many processes: the sandbox's limit is %d tasks", limit)}
}

// busiest returns the sandbox's total task count and the tree with the
// most tasks: a running process's (p), or else that of a helper the
// table spawned (a kernel) or of a process group whose leader has ended
// (root, its pid or group id).
func (t *Table) busiest() (total int64, p *Process, root int) {
	procs := scanProcs()
	for _, e := range procs {
		total += int64(max(e.threads, 1))
	}
	size := func(root int) (n int, members []int) {
		members = treeOf(procs, root)
		for _, pid := range members {
			n += max(procs[pid].threads, 1)
		}
		return n, members
	}
	covered := map[int]bool{}
	best := -1
	for _, rp := range t.runningProcesses() {
		n, members := size(rp.pid)
		for _, m := range members {
			covered[m] = true
		}
		if n > best {
			best, p, root = n, rp, 0
		}
	}
	t.mu.Lock()
	var roots []int
	for pid := range t.spawned {
		roots = append(roots, pid)
	}
	t.mu.Unlock()
	self := os.Getpid()
	for _, e := range procs {
		if e.pgid > 1 && e.pgid != self && !covered[e.pid] {
			roots = append(roots, e.pgid)
		}
	}
	for _, r := range roots {
		if covered[r] {
			continue
		}
		n, members := size(r)
		for _, m := range members {
			covered[m] = true
		}
		covered[r] = true
		if n > best && n > 0 {
			best, p, root = n, nil, r
		}
	}
	return total, p, root
}
func oomReason(limit int64) exitCause {
	return exitCause{reason: api.ExitOOM, message: fmt.Sprintf(
		"out of memory: the sandbox's memory limit is %d MiB", limit>>20)}
}

// largest returns the tree with the largest RSS: a running process's (p),
// or a spawned helper's (root).
func (t *Table) largest() (p *Process, root int) {
	procs := scanProcs()
	var bestRSS int64 = -1
	for _, rp := range t.runningProcesses() {
		if rss := treeRSS(procs, rp.pid); rss > bestRSS {
			p, bestRSS = rp, rss
		}
	}
	t.mu.Lock()
	spawned := make([]int, 0, len(t.spawned))
	for pid := range t.spawned {
		spawned = append(spawned, pid)
	}
	t.mu.Unlock()
	for _, pid := range spawned {
		if rss := treeRSS(procs, pid); rss > bestRSS {
			p, root, bestRSS = nil, pid, rss
		}
	}
	return p, root
}
