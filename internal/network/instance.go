package network

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// One Network per host namespace: its nftables table "kiln", its links
// kv<slot> and its pool are the namespace's, so a second Network there
// would replace the first's table and reuse its link names. New takes an
// exclusive lock named after the namespace's identity (device and inode,
// not its name) for the Network's lifetime; the kernel drops it when the
// process ends, so a crashed kiln serve leaves no stale lock.

// LockDir holds the host namespaces' locks.
var LockDir = "/run/kiln"

// CheckHost reports why this host cannot run sandbox networking, or nil:
// it needs root and the nft and ip commands.
func CheckHost() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("sandbox networking needs root: %w", errdefs.ErrFailedPrecondition)
	}
	for _, cmd := range []string{"nft", "ip", "nsenter", "tc"} {
		if _, err := exec.LookPath(cmd); err != nil {
			return fmt.Errorf("sandbox networking needs %s (nftables, iproute2, util-linux: scripts/setup-deps.sh): %w", cmd, errdefs.ErrFailedPrecondition)
		}
	}
	return nil
}

// lockHostNS takes the lock of host namespace ns ("" is kiln's own) and
// returns the open lock file, or an error naming the process that holds
// it.
func lockHostNS(ns string) (*os.File, error) {
	path := "/proc/self/ns/net"
	if ns != "" {
		path = NSPath(ns)
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return nil, fmt.Errorf("identifying the host network namespace: %w", err)
	}
	if err := os.MkdirAll(LockDir, 0o755); err != nil {
		return nil, fmt.Errorf("creating the network lock dir: %w", err)
	}
	name := filepath.Join(LockDir, fmt.Sprintf("netns-%d-%d.lock", st.Dev, st.Ino))
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the network lock: %w", err)
	}
	if err := flockHeld(f); err != nil {
		b, _ := os.ReadFile(name)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			holder := strings.TrimSpace(string(b))
			if _, perr := strconv.Atoi(holder); perr != nil {
				holder = "?"
			}
			if others := openers(name); len(others) > 0 {
				holder = strings.Join(others, ", ")
			}
			where := "this host's network namespace"
			if ns != "" {
				where = "network namespace " + ns
			}
			return nil, fmt.Errorf("another kiln serve (pid %s) runs sandbox networking in %s; give this one a namespace of its own (KILN_NETWORK_HOST_NS) or run it with KILN_NETWORK=off: %w",
				holder, where, errdefs.ErrFailedPrecondition)
		}
		return nil, fmt.Errorf("locking the host network namespace: %w", err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}

// lockWait is how long lockHostNS waits for a lock whose recorded holder
// has ended: a kiln serve killed while it was starting a command leaves
// the lock with that child until the child's exec closes it, and a
// restart (a supervisor's, or a crash drill's) may come that soon.
const lockWait = 10 * time.Second

// flockHeld takes f's exclusive lock; while another holds it and the pid
// recorded in it is no longer alive, it tries again for up to lockWait.
func flockHeld(f *os.File) error {
	deadline := time.Now().Add(lockWait)
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if !errors.Is(err, unix.EWOULDBLOCK) || time.Now().After(deadline) {
			return err
		}
		b := make([]byte, 32)
		n, _ := f.ReadAt(b, 0)
		pid, perr := strconv.Atoi(strings.TrimSpace(string(b[:n])))
		if perr != nil || pid <= 0 || unix.Kill(pid, 0) != unix.ESRCH {
			return err // held by a live kiln serve (or one we cannot tell)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// openers lists the processes (pid and command) that have the file name
// open, but this one.
func openers(name string) []string {
	var out []string
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	seen := map[string]bool{}
	for _, fd := range fds {
		pid := strings.Split(fd, "/")[2]
		if seen[pid] || pid == strconv.Itoa(os.Getpid()) {
			continue
		}
		if target, err := os.Readlink(fd); err == nil && target == name {
			seen[pid] = true
			comm, _ := os.ReadFile("/proc/" + pid + "/comm")
			out = append(out, pid+" "+strings.TrimSpace(string(comm)))
		}
	}
	return out
}
