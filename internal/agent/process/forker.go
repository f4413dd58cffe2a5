package process

import (
	"fmt"
	"os"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// forker runs every fork on one OS thread that was moved into the pids
// cgroup meant for user processes. Cgroup v1 membership is per thread and a
// child starts in its forking thread's cgroup, so every process started
// through the API is born under the sandbox's pids limit, with no window,
// while the agent's other threads stay outside it: a fork bomb then gets
// EAGAIN from the kernel instead of starving the agent, whose Go runtime
// dies when it cannot create a thread.
type forker struct {
	reqs chan func()
}

// newForker moves a fresh, locked OS thread into the cgroup whose tasks
// file is given and runs setup (if not nil) on it.
func newForker(tasksFile string, setup func() error) (*forker, error) {
	f := &forker{reqs: make(chan func())}
	errc := make(chan error, 1)
	placed := make(chan struct{})
	var run func()
	run = func() {
		// Never unlocked: the thread belongs to the user cgroup for good,
		// and exits with this goroutine.
		runtime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			// The main thread must stay out (threads it creates inherit
			// its cgroup): hold it while another goroutine, which then
			// cannot run here, takes a different thread.
			go run()
			<-placed
			runtime.UnlockOSThread()
			return
		}
		err := os.WriteFile(tasksFile, []byte(strconv.Itoa(unix.Gettid())), 0)
		close(placed)
		if err != nil {
			errc <- fmt.Errorf("joining the user pids cgroup: %w", err)
			return
		}
		if setup != nil {
			if err := setup(); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
		for fn := range f.reqs {
			fn()
		}
	}
	go run()
	if err := <-errc; err != nil {
		return nil, err
	}
	return f, nil
}

// do runs fn on the forker's thread and waits for it.
func (f *forker) do(fn func()) {
	done := make(chan struct{})
	f.reqs <- func() { fn(); close(done) }
	<-done
}
