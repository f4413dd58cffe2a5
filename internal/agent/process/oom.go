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

// guardMemory is the userspace OOM guard (for gVisor, where the host's
// cgroup would kill the whole sandbox rather than one process). While any
// process runs it polls memory use every interval and, above the limit
// minus a margin, SIGKILLs the tree with the largest RSS among processes
// started through the API, marking its exit out_of_memory.
func (t *Table) guardMemory(limit int64, usage func() (int64, error), interval time.Duration) {
	threshold := limit - oomMargin(limit)
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
			used, err := usage()
			if err != nil || used <= threshold {
				continue
			}
			if victim := t.largest(); victim != nil {
				t.log.Warn("memory limit reached: killing the largest process", "pid", victim.pid,
					"usage", used, "limit", limit)
				victim.kill(oomReason(limit))
				// Give the kernel time to free the victim's memory.
				select {
				case <-victim.done:
				case <-time.After(time.Second):
				case <-t.stop:
				}
			}
		}
		tick.Stop()
	}
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
