package process

import (
	"errors"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// exitFunc receives a reaped child's wait status.
type exitFunc func(ws unix.WaitStatus)

// reaper collects the exit statuses of child processes and hands them to
// whoever started them.
//
// In reap-all mode (the agent as PID 1 or as a child subreaper) one loop
// calls wait4(-1) on every SIGCHLD and dispatches by pid; children nobody
// registered (orphans re-parented to us) are simply reaped. Forking and
// registering happen under the same mutex as wait4+lookup, so a child that
// exits at once is never reaped before it is registered, and a reaped pid
// cannot be reused by a new child before its exit is dispatched.
//
// In own-children mode (the agent's server embedded in another program,
// e.g. tests) each child gets a goroutine blocked in wait4(pid), so the
// host program's other children are left to their owners.
type reaper struct {
	all     bool
	forker  *forker // nil: fork on any thread
	log     *slog.Logger
	mu      sync.Mutex
	waiters map[int]exitFunc
	stop    chan struct{}
	once    sync.Once
}

func newReaper(all bool, log *slog.Logger) *reaper {
	r := &reaper{all: all, log: log, waiters: make(map[int]exitFunc), stop: make(chan struct{})}
	if all {
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, unix.SIGCHLD)
		go r.loop(sigs)
	}
	return r
}

// start runs fork and registers onExit for the pid it returns.
func (r *reaper) start(fork func() (int, error), onExit exitFunc) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var pid int
	var err error
	if r.forker != nil {
		r.forker.do(func() { pid, err = fork() })
	} else {
		pid, err = fork()
	}
	if err != nil {
		return 0, err
	}
	if r.all {
		r.waiters[pid] = onExit
	} else {
		go waitOne(pid, onExit)
	}
	return pid, nil
}

func (r *reaper) close() {
	r.once.Do(func() {
		close(r.stop)
		if r.forker != nil {
			r.mu.Lock() // no fork in flight
			close(r.forker.reqs)
			r.mu.Unlock()
		}
	})
}

func (r *reaper) loop(sigs chan os.Signal) {
	defer signal.Stop(sigs)
	for {
		r.reapAll()
		safety, stop := r.safetyNet()
		select {
		case <-sigs:
		case <-safety:
		case <-r.stop:
			stop()
			return
		}
		stop()
	}
}

// safetyNetEvery is how often the reap loop also wakes while children
// run.
const safetyNetEvery = time.Second

// safetyNet is a wakeup after safetyNetEvery while children the agent
// started run (nil while none do), and its stop. It is a safety net:
// SIGCHLD alone suffices, because every wakeup reaps until nothing is
// left. An idle agent sleeps until a signal: a timer firing every second
// with nothing to do cost each idle runsc sandbox ~1 ms of host CPU per
// second (the Sentry and its systrap stubs wake for it), most of an idle
// sandbox's CPU (docs/benchmarks.md, issue 19 item 6).
func (r *reaper) safetyNet() (<-chan time.Time, func()) {
	r.mu.Lock()
	running := len(r.waiters) > 0
	r.mu.Unlock()
	if !running {
		return nil, func() {}
	}
	t := time.NewTimer(safetyNetEvery)
	return t.C, func() { t.Stop() }
}

func (r *reaper) reapAll() {
	for {
		var ws unix.WaitStatus
		r.mu.Lock()
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		var fn exitFunc
		if pid > 0 {
			fn = r.waiters[pid]
			delete(r.waiters, pid)
		}
		r.mu.Unlock()
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil || pid <= 0:
			return // ECHILD: no children; 0: none exited yet
		case fn != nil:
			fn(ws)
		default:
			r.log.Debug("reaped orphan", "pid", pid, "status", int(ws))
		}
	}
}

func waitOne(pid int, onExit exitFunc) {
	for {
		var ws unix.WaitStatus
		_, err := unix.Wait4(pid, &ws, 0, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			// Someone else reaped it; report an unknown status.
			ws = unix.WaitStatus(0xff << 8)
		}
		onExit(ws)
		return
	}
}
