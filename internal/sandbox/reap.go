package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
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

// userPidsCgroup is the child of a runc sandbox's pids cgroup that holds
// the processes started through the agent, under the sandbox's pids limit.
func userPidsCgroup(id ID) string {
	return filepath.Join("/sys/fs/cgroup/pids", cgroupsPath(id), "user")
}

// makeUserPidsCgroup creates the user pids cgroup (and so the sandbox's
// own, which runc then joins) with the sandbox's pids limit.
func makeUserPidsCgroup(id ID, limit int64) (string, error) {
	dir := userPidsCgroup(id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("creating pids cgroup: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "pids.max"), []byte(strconv.FormatInt(limit, 10)), 0); err != nil {
		return "", fmt.Errorf("setting pids limit: %w", err)
	}
	return dir, nil
}

// removeUserPidsCgroup removes the user pids cgroup once it is empty; a
// missing one is fine. Killed processes that are not our children (after a
// restart of kiln serve) stay in it as zombies until the host's init reaps
// them, so it waits for that, up to a bound.
func removeUserPidsCgroup(id ID) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := os.Remove(userPidsCgroup(id))
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("removing pids cgroup: %w", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// sandboxPids lists the host pids of a sandbox: those in its cgroup and the
// user cgroup below it, and those whose command line names its directory
// (runsc's gofer, which may live outside the cgroup and outlive a dead
// sentry). Of the latter only the known pids are looked at when there are
// any (the runtime's own, learnt at start: runsc's sentry and gofer);
// without them every process on the host is (an adopted sandbox), which
// grows with the host's processes: with 1,000 runsc sandboxes each kill
// read ~2,000 command lines twice.
func sandboxPids(id ID, dir string, known []int) []int {
	var pids []int
	for _, cg := range []string{filepath.Join("/sys/fs/cgroup/pids", cgroupsPath(id)), userPidsCgroup(id)} {
		b, err := os.ReadFile(filepath.Join(cg, "cgroup.procs"))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	if dir == "" {
		return pids
	}
	var procs []string
	if len(known) > 0 {
		for _, pid := range known {
			procs = append(procs, "/proc/"+strconv.Itoa(pid)+"/cmdline")
		}
	} else {
		procs, _ = filepath.Glob("/proc/[0-9]*/cmdline")
	}
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(b, []byte(dir)) {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p))); err == nil && !slices.Contains(pids, pid) && pid != os.Getpid() {
			pids = append(pids, pid)
		}
	}
	return pids
}

// reap waits up to timeout for pids to exit, reaping the ones that are our
// children. Pids that are not our children are left to their parents to
// reap, but still waited for until they are zombies: a process drops its
// mounts as it exits, and the caller unmounts next.
func reap(pids []int, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for len(pids) > 0 && time.Now().Before(deadline) {
		left := pids[:0]
		for _, pid := range pids {
			var ws unix.WaitStatus
			n, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil)
			switch {
			case n == 0 && err == nil:
				left = append(left, pid) // our child, still running
			case errors.Is(err, unix.ECHILD) && running(pid):
				left = append(left, pid) // not ours, still running
			}
		}
		pids = left
		if len(pids) > 0 {
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// running reports whether pid exists and is not a zombie.
func running(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	// The state follows the command, which is in parentheses and may hold
	// any byte.
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] != 'Z' && b[i+2] != 'X'
}

// deleteContainer kills a sandbox's container, reaps its processes and
// deletes it from the runtime. Deleting an unknown container succeeds.
// started are the runtime's processes as seen at start (nil if unknown):
// a sandbox that died on its own has left its cgroup, runsc then no longer
// reports its pids, and their zombies (ours) would make `runsc delete` wait.
func deleteContainer(ctx context.Context, rt oci.Runtime, id ID, dir string, started []int) error {
	pids := append(sandboxPids(id, dir, started), started...)
	_ = rt.Kill(ctx, id.String(), unix.SIGKILL)
	// Whatever is left (e.g. the gofer of a runsc sandbox whose sentry died,
	// which runsc kill can no longer reach) belongs to the sandbox alone.
	for _, pid := range sandboxPids(id, dir, started) {
		_ = unix.Kill(pid, unix.SIGKILL)
		pids = append(pids, pid)
	}
	reap(pids, 5*time.Second)
	if err := removeUserPidsCgroup(id); err != nil {
		return err
	}
	return rt.Delete(ctx, id.String(), true)
}
