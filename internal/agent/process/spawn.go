package process

import (
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kiln-sh/kiln/api"
)

// Spawn forks and executes argv0 for a long-lived helper of the agent (a
// code kernel, say) that the table does not list or manage: the caller
// owns the process and its descriptors. The guard may kill its tree when
// the pids limit is reached (see checkPids) or, under gVisor, when it holds
// the most memory as the sandbox's runs out (see guard). Its wait status goes to onExit
// through the table's reaper, so that in reap-all mode the wait4(-1) loop
// routes it rather than swallowing it as an orphan's.
func (t *Table) Spawn(argv0 string, argv []string, attr *syscall.ProcAttr, onExit func(syscall.WaitStatus)) (int, error) {
	select {
	case <-t.stop:
		return 0, apiErrorf(api.CodeUnavailable, "the agent is shutting down")
	default:
	}
	var pid int
	pid, err := t.reaper.start(func() (int, error) {
		var err error
		pid, err = syscall.ForkExec(argv0, argv, attr)
		if err == nil {
			// Before the reaper can route its exit (we hold its lock).
			t.mu.Lock()
			t.spawned[pid] = true
			t.mu.Unlock()
			t.wakeGuard()
		}
		return pid, err
	}, func(ws unix.WaitStatus) {
		t.mu.Lock()
		delete(t.spawned, pid)
		t.mu.Unlock()
		onExit(syscall.WaitStatus(ws))
	})
	return pid, err
}
