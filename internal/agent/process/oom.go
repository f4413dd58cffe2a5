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

// guard is the userspace resource guard, for gVisor: there the host's
// cgroup can only kill the whole sandbox, not one process in it. While any
// process runs it polls every interval and SIGKILLs the offending tree:
//   - memory above the limit minus a margin: the tree with the largest RSS
//     among processes started through the API, marked out_of_memory;
//   - more tasks (threads) than the pids limit: the tree with the most
//     tasks, marked pids_limit.
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
		for t.runningCount() > 0 {
			select {
			case <-t.stop:
				tick.Stop()
				return
			case <-tick.C:
			}
			var victim *Process
			var cause exitCause
			if o.PidsLimit > 0 {
				if tasks, busiest := t.busiest(); tasks > o.PidsLimit && busiest != nil {
					victim = busiest
					t.log.Warn("pids limit reached: killing the process tree with the most tasks", "pid", victim.pid, "tasks", tasks, "limit", o.PidsLimit)
					cause = exitCause{reason: api.ExitPidsLimit, message: fmt.Sprintf(
						"too many processes: the sandbox's limit is %d tasks", o.PidsLimit)}
				}
			}
			if used, err := o.MemoryUsage(); victim == nil && memory && err == nil && used > threshold {
				if victim = t.largest(); victim != nil {
					t.log.Warn("memory limit reached: killing the largest process", "pid", victim.pid, "usage", used, "limit", o.MemoryLimit)
					cause = oomReason(o.MemoryLimit)
				}
			}
			if victim == nil {
				continue
			}
			victim.kill(cause)
			// Give the kernel time to free the victim's resources.
			select {
			case <-victim.done:
			case <-time.After(time.Second):
			case <-t.stop:
			}
		}
		tick.Stop()
	}
}

// busiest returns the sandbox's total task count and the running process
// whose tree has the most tasks.
func (t *Table) busiest() (int64, *Process) {
	procs := scanProcs()
	var total int64
	for _, e := range procs {
		total += int64(max(e.threads, 1))
	}
	var best *Process
	bestTasks := -1
	for _, p := range t.runningProcesses() {
		n := 0
		for _, pid := range treeOf(procs, p.pid) {
			n += max(procs[pid].threads, 1)
		}
		if n > bestTasks {
			best, bestTasks = p, n
		}
	}
	return total, best
}

func oomReason(limit int64) exitCause {
	return exitCause{reason: api.ExitOOM, message: fmt.Sprintf(
		"out of memory: the sandbox's memory limit is %d MiB", limit>>20)}
}

// largest returns the running process whose tree has the largest RSS.
func (t *Table) largest() *Process {
	procs := scanProcs()
	var best *Process
	var bestRSS int64 = -1
	for _, p := range t.runningProcesses() {
		if rss := treeRSS(procs, p.pid); rss > bestRSS {
			best, bestRSS = p, rss
		}
	}
	return best
}
