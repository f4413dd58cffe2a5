package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kiln-sh/kiln/internal/oci"
)

// The runtimes' long-lived processes (runc's container init, runsc's
// sandbox and gofer) are orphaned when `runtime create` exits. As a child
// subreaper this process inherits them and reaps them promptly when a
// sandbox is destroyed; otherwise they linger as zombies of the host's
// init, and `runsc delete` waits (~1.5 s here) until that init gets to
// them. Only a destroyed sandbox's own pids are waited for, so this never
// steals the exit status of an exec.Cmd.
func becomeSubreaper() error {
	return unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
}

// sandboxPids lists the host pids in a sandbox's cgroup.
func sandboxPids(id ID) []int {
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/pids", cgroupsPath(id), "cgroup.procs"))
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// reap waits up to timeout for pids to exit, reaping the ones that are our
// children. Pids that are not our children are left to their parents.
func reap(pids []int, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for len(pids) > 0 && time.Now().Before(deadline) {
		left := pids[:0]
		for _, pid := range pids {
			var ws unix.WaitStatus
			n, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil)
			if n == 0 && err == nil {
				left = append(left, pid) // our child, still running
			}
		}
		pids = left
		if len(pids) > 0 {
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// deleteContainer kills a sandbox's container, reaps its processes and
// deletes it from the runtime. Deleting an unknown container succeeds.
// mainPid is the runtime's main process as seen at start (0 if unknown): a
// sandbox that died on its own has left its cgroup, runsc then no longer
// reports its pid, and its zombie (ours) would make `runsc delete` wait.
func deleteContainer(ctx context.Context, rt oci.Runtime, id ID, mainPid int) error {
	pids := sandboxPids(id)
	if mainPid > 0 {
		pids = append(pids, mainPid)
	}
	_ = rt.Kill(ctx, id.String(), unix.SIGKILL)
	// Whatever is left in the sandbox's cgroup (e.g. the gofer of a runsc
	// sandbox whose sentry died, which runsc kill can no longer reach)
	// belongs to the sandbox alone.
	for _, pid := range sandboxPids(id) {
		_ = unix.Kill(pid, unix.SIGKILL)
	}
	reap(pids, 5*time.Second)
	return rt.Delete(ctx, id.String(), true)
}
