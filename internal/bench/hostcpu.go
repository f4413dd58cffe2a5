package bench

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// sandboxCgroups is cgroup v1's cpuacct hierarchy under which every
// sandbox has its cgroup (cgroupsPath "/kiln/<id>").
const sandboxCgroups = "/sys/fs/cgroup/cpuacct/kiln"

// CreateCPU is host CPU time per create, split by who spent it.
type CreateCPU struct {
	// Kiln is this process (the Manager's Go code: store, mounts, bundle,
	// channel handshake, the command), user + system.
	Kiln time.Duration `json:"kiln_ns"`
	// Commands are the commands it ran and waited for: runsc create,
	// start, state, mkfs.ext4 (not the sandbox processes runsc leaves).
	Commands time.Duration `json:"commands_ns"`
	// Sandboxes is what the sandboxes' cgroups were charged: runsc's
	// sandbox (the Sentry, booting and running the agent) and gofer.
	Sandboxes time.Duration `json:"sandboxes_ns"`
}

// Total is the sum.
func (c CreateCPU) Total() time.Duration { return c.Kiln + c.Commands + c.Sandboxes }

// processCPU samples this process's CPU and its waited-for children's.
func processCPU() CreateCPU {
	tv := func(t syscall.Timeval) time.Duration { return time.Duration(t.Nano()) }
	var c CreateCPU
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		c.Kiln = tv(ru.Utime) + tv(ru.Stime)
	}
	if syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru) == nil {
		c.Commands = tv(ru.Utime) + tv(ru.Stime)
	}
	return c
}

// sandboxesCPU is the CPU the cgroups of sandboxes ids were charged
// (their whole lives so far): only these sandboxes', whatever else runs
// on the host.
func sandboxesCPU(ids []string) time.Duration {
	var sum time.Duration
	for _, id := range ids {
		if id == "" {
			continue
		}
		if b, err := os.ReadFile(filepath.Join(sandboxCgroups, id, "cpuacct.usage")); err == nil {
			n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
			sum += time.Duration(n)
		}
	}
	return sum
}

// perCreate is (to - from) / n.
func perCreate(from, to CreateCPU, n int) CreateCPU {
	if n == 0 {
		return CreateCPU{}
	}
	d := func(a, b time.Duration) time.Duration { return (b - a) / time.Duration(n) }
	return CreateCPU{Kiln: d(from.Kiln, to.Kiln), Commands: d(from.Commands, to.Commands), Sandboxes: d(from.Sandboxes, to.Sandboxes)}
}
