package process

import (
	"bytes"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// procEntry is what /proc/<pid>/stat says about one process.
type procEntry struct {
	pid, ppid, pgid, sid int
	threads              int
	rssPages             int64
}

// scanProcs reads every process's parentage from /proc.
func scanProcs() map[int]procEntry {
	dir, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	procs := make(map[int]procEntry, len(dir))
	for _, d := range dir {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + d.Name() + "/stat")
		if err != nil {
			continue // it exited meanwhile
		}
		if e, ok := parseStat(pid, b); ok {
			procs[pid] = e
		}
	}
	return procs
}

// parseStat parses /proc/<pid>/stat; comm may contain spaces and
// parentheses, so fields are counted from the last ')'.
func parseStat(pid int, b []byte) (procEntry, bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procEntry{}, false
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 22 {
		return procEntry{}, false
	}
	atoi := func(b []byte) int { n, _ := strconv.Atoi(string(b)); return n }
	e := procEntry{pid: pid, ppid: atoi(f[1]), pgid: atoi(f[2]), sid: atoi(f[3]), threads: atoi(f[17])}
	e.rssPages, _ = strconv.ParseInt(string(f[21]), 10, 64)
	return e, true
}

// treeOf returns the processes that belong to the process tree rooted at
// root: root itself, every member of its process group, every member of
// its session if root leads one (PTY processes), and every descendant of
// any of those by current parentage. Descendants that left the group with
// setsid/setpgid are found through parentage as long as their parent
// chain is intact; a process whose parent died is re-parented to the
// agent (or init) and can no longer be attributed — a documented gap.
func treeOf(procs map[int]procEntry, root int) []int {
	self := os.Getpid()
	in := map[int]bool{}
	var queue []int
	add := func(pid int) {
		if pid <= 1 || pid == self || in[pid] {
			return
		}
		in[pid] = true
		queue = append(queue, pid)
	}
	if _, ok := procs[root]; ok {
		add(root)
	}
	children := make(map[int][]int)
	for _, e := range procs {
		if e.pgid == root || e.sid == root {
			add(e.pid)
		}
		children[e.ppid] = append(children[e.ppid], e.pid)
	}
	for i := 0; i < len(queue); i++ {
		for _, c := range children[queue[i]] {
			add(c)
		}
	}
	return queue
}

// killTree SIGKILLs the tree rooted at root (see treeOf). It first stops
// every member with SIGSTOP, re-scanning until no new member appears, so
// that nothing can fork or escape between the scan and the kill.
func killTree(root int) {
	// Freeze the group at once, with one call: a fork bomb's processes,
	// spinning on fork, may leave the agent little CPU for the scans.
	_ = unix.Kill(-root, unix.SIGSTOP)
	stopped := map[int]bool{}
	for range 10 {
		found := false
		for _, pid := range treeOf(scanProcs(), root) {
			if !stopped[pid] {
				stopped[pid] = true
				found = true
				_ = unix.Kill(pid, unix.SIGSTOP)
			}
		}
		if !found {
			break
		}
	}
	_ = unix.Kill(-root, unix.SIGKILL)
	for pid := range stopped {
		_ = unix.Kill(pid, unix.SIGKILL)
	}
}

// treeRSS is the resident memory of root's tree in bytes.
func treeRSS(procs map[int]procEntry, root int) int64 {
	var pages int64
	for _, pid := range treeOf(procs, root) {
		pages += procs[pid].rssPages
	}
	return pages * int64(os.Getpagesize())
}
