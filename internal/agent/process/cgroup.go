package process

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The pids limit inside gVisor.
//
// Under gVisor the host's pids cgroup counts the sentry's host threads and
// stub processes, not the sandbox's tasks, so the limit must be enforced
// inside. The sentry's own cgroupfs has a pids controller, but it does not
// enforce pids.max exactly: a fork charges only the first of the forking
// task's cgroups, taken in Go map order, so with the seven hierarchies the
// sentry mounts a fork over the limit fails only about one time in seven
// (measured: pids.max 5 let 14 tasks run). RLIMIT_NPROC is exact there: the
// sentry counts every task under the real uid that created it, atomically,
// and refuses a clone over the forking task's limit unless that task has
// CAP_SYS_ADMIN or CAP_SYS_RESOURCE (root included).
//
// So the agent (see sentryPids):
//   - sets its RLIMIT_NPROC (soft and hard) to the limit minus one, which
//     every process it starts inherits: each account's tasks, counted
//     over the whole sandbox, stay at most that, and a command's own first
//     process (counted apart, below) makes the limit exact for one command;
//   - keeps CAP_SYS_RESOURCE (the spec grants it) on its own threads, so it
//     is exempt and never starved of threads, and drops it from its
//     bounding set, so nothing it runs can gain it;
//   - runs its own threads under a real uid of their own (agentRUID), so
//     they are not counted with root's processes, and the forker thread
//     under another (forkerRUID), without CAP_SYS_RESOURCE: the processes
//     it starts are counted there, so at most limit-1 commands run at once;
//   - starts every process in a pids cgroup of the sentry (sentryUserCgroup):
//     its exact pids.current is what the guard watches to find the tree to
//     kill when the limit is reached (see Table.guard).
const (
	sentryPidsRoot   = "/sys/fs/cgroup/pids"
	sentryUserCgroup = sentryPidsRoot + "/kiln-user"
	agentRUID        = 2147483645
	forkerRUID       = 2147483646
)

// errNoSysResource means the agent lacks CAP_SYS_RESOURCE, without which a
// process-wide RLIMIT_NPROC would limit its own threads too.
var errNoSysResource = errors.New("the agent lacks CAP_SYS_RESOURCE")

// sentryPids sets up the limit inside gVisor (see above) and returns the
// tasks file of the cgroup to start processes in. A failure leaves the
// limit to the guard alone.
func sentryPids(limit int64) (tasksFile string, err error) {
	if err := os.Mkdir(sentryUserCgroup, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("creating the user pids cgroup: %w", err)
	}
	// The forker thread is in it too: one more than the processes.
	if err := os.WriteFile(filepath.Join(sentryUserCgroup, "pids.max"), []byte(strconv.FormatInt(limit+1, 10)), 0); err != nil {
		return "", fmt.Errorf("setting the user pids cgroup's limit: %w", err)
	}
	tasksFile = filepath.Join(sentryUserCgroup, "tasks")
	if !hasCap(unix.CAP_SYS_RESOURCE) {
		return tasksFile, errNoSysResource
	}
	if err := syscall.Setresuid(agentRUID, -1, -1); err != nil {
		return tasksFile, fmt.Errorf("setting the agent's real uid: %w", err)
	}
	n := uint64(max(limit-1, 1))
	if err := unix.Setrlimit(unix.RLIMIT_NPROC, &unix.Rlimit{Cur: n, Max: n}); err != nil {
		return tasksFile, fmt.Errorf("setting RLIMIT_NPROC: %w", err)
	}
	return tasksFile, nil
}

// dropBoundingSysResource removes CAP_SYS_RESOURCE from every thread's
// bounding set, so that no program the agent executes can hold it.
func dropBoundingSysResource() error {
	if _, _, e := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, unix.CAP_SYS_RESOURCE, 0); e != 0 {
		return fmt.Errorf("dropping CAP_SYS_RESOURCE from the bounding set: %w", e)
	}
	return nil
}

// forkerThreadSetup runs on the forker's thread before it forks anything:
// it takes CAP_SYS_RESOURCE off that thread alone and, inside gVisor, gives
// it its own real uid (see above). Both are per-thread changes made with
// raw syscalls (Go's wrappers would apply them to every thread).
func forkerThreadSetup(sentry bool) error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("reading the forker's capabilities: %w", err)
	}
	bit := uint32(1) << (unix.CAP_SYS_RESOURCE % 32)
	i := unix.CAP_SYS_RESOURCE / 32
	data[i].Effective &^= bit
	data[i].Permitted &^= bit
	data[i].Inheritable &^= bit
	if _, _, e := unix.RawSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return fmt.Errorf("dropping the forker's CAP_SYS_RESOURCE: %w", e)
	}
	if sentry {
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, forkerRUID, ^uintptr(0), ^uintptr(0)); e != 0 {
			return fmt.Errorf("setting the forker's real uid: %w", e)
		}
	}
	return nil
}

// hasCap reports whether the calling thread has capability c in its
// effective set.
func hasCap(c int) bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return data[c/32].Effective&(1<<(c%32)) != 0
}

// pidsCounter reads how close the processes started through the agent are
// to their pids limit: the cgroup they start in (runc: the host's, mounted
// by the host; gVisor: the sentry's) holds them all.
type pidsCounter struct {
	dir   string
	limit int64 // the limit, for messages
	at    int64 // without events: the processes' task count that is a hit
	extra int64 // tasks in the cgroup that are not processes' (the forker thread)
	// events: the cgroup has pids.events (the host kernel's), whose "max"
	// counter counts refused forks; otherwise (gVisor) reaching the limit
	// is what counts.
	events  bool
	lastMax int64
}

// newPidsCounter watches the cgroup of tasksFile. limit is the sandbox's
// (0: the cgroup's pids.max). Without pids.events (inside gVisor, whose
// sentry tells nobody when RLIMIT_NPROC refuses a fork, see sentryPids)
// the processes holding within limit/32 (at least 1) of the limit is a
// hit. The limit itself stays exact: only the decision to kill has slack.
func newPidsCounter(tasksFile string, limit, extra int64) *pidsCounter {
	c := &pidsCounter{dir: filepath.Dir(tasksFile), limit: limit, extra: extra}
	if n, err := readKeyed(filepath.Join(c.dir, "pids.events"), "max"); err == nil {
		c.events, c.lastMax = true, n
	}
	if c.limit <= 0 {
		if b, err := os.ReadFile(filepath.Join(c.dir, "pids.max")); err == nil {
			c.limit, _ = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		}
	}
	// A bash fork bomb's shells exit and retry, so the count hovers just
	// below the limit: a few percent of slack lets a 30 ms poll see it.
	c.at = c.limit - max(1, c.limit/32)
	return c
}

// current is the number of the processes' tasks.
func (c *pidsCounter) current() (int64, error) {
	n, err := readInt(filepath.Join(c.dir, "pids.current"))
	return n - c.extra, err
}

// hit reports whether the limit was hit since the last call: a fork was
// refused (pids.events) or the processes hold every task they may.
func (c *pidsCounter) hit() bool {
	if c.events {
		n, err := readKeyed(filepath.Join(c.dir, "pids.events"), "max")
		if err != nil {
			return false
		}
		hit := n > c.lastMax
		c.lastMax = n
		return hit
	}
	cur, err := c.current()
	return err == nil && c.at > 0 && cur >= c.at
}
