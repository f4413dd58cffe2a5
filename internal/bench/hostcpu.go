package bench

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// sandboxesCPUFile is cpuacct's usage (ns) of the cgroup every sandbox's
// cgroup sits under (cgroupsPath "/kiln/<id>", cgroup v1). cpuacct
// charges a task's time to its cgroup and every ancestor, so the parent
// keeps the time of sandboxes already removed.
const sandboxesCPUFile = "/sys/fs/cgroup/cpuacct/kiln/cpuacct.usage"

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

// hostCPU samples the counters CreateCPU is made of.
func hostCPU() CreateCPU {
	tv := func(t syscall.Timeval) time.Duration { return time.Duration(t.Nano()) }
	var c CreateCPU
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		c.Kiln = tv(ru.Utime) + tv(ru.Stime)
	}
	if syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru) == nil {
		c.Commands = tv(ru.Utime) + tv(ru.Stime)
	}
	if b, err := os.ReadFile(sandboxesCPUFile); err == nil {
		n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		c.Sandboxes = time.Duration(n)
	}
	return c
}

// perCreate is (to - from) / n.
func perCreate(from, to CreateCPU, n int) CreateCPU {
	if n == 0 {
		return CreateCPU{}
	}
	d := func(a, b time.Duration) time.Duration { return (b - a) / time.Duration(n) }
	return CreateCPU{Kiln: d(from.Kiln, to.Kiln), Commands: d(from.Commands, to.Commands), Sandboxes: d(from.Sandboxes, to.Sandboxes)}
}
