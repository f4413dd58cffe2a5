package process

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kiln-sh/kiln/api"
)

const (
	// readChunk bounds one output event's data.
	readChunk = 32 << 10
	// drainIdle: once the process has exited, output pipes still held by
	// its background children are read until they stay silent this long.
	drainIdle = 100 * time.Millisecond
	// drainMax bounds reading after exit in all cases.
	drainMax = 2 * time.Second
	// drainBufferedMax bounds the final read of what a pipe still holds.
	drainBufferedMax = 1 << 20
	// groupWaitMax bounds how long reading goes on after exit while the
	// process's group keeps growing (a fork bomb whose first shell
	// returned at once), so that the guard can kill it and the exit
	// status say so.
	groupWaitMax = 2 * time.Minute
)

// exitCause is why the agent killed a process, if it did.
type exitCause struct {
	reason  api.ExitReason
	message string
}

// Process is one process started through the agent.
type Process struct {
	table    *Table
	pid      int
	log      *eventLog
	outLimit int64
	timeout  time.Duration
	timer    *time.Timer
	pty      *os.File // the terminal's master, or nil
	oomBase  int64    // the kernel's OOM kill count when it started
	oomKnown bool

	stdinMu     sync.Mutex
	stdin       *os.File // stdin's write end (or the PTY master), or nil
	stdinClosed bool

	exitAt atomic.Int64 // unix nanos when it was reaped, 0 before
	ws     unix.WaitStatus
	exited chan struct{} // closed when reaped; ws is then set
	done   chan struct{} // closed once the exit event is logged

	mu    sync.Mutex
	cause exitCause
	info  api.ProcessInfo // Exit is set once done

	growMu   sync.Mutex // guards the samples of groupGrowing
	growAt   time.Time  // last sample
	growN    int64      // the processes' task count at exit
	growTree int        // the size of the tree left at exit; 0: none
	growing  bool
}

// PID returns the process's pid (and process group id).
func (p *Process) PID() int { return p.pid }

// Done is closed once the process has ended and its exit event is logged.
func (p *Process) Done() <-chan struct{} { return p.done }

// Info describes the process.
func (p *Process) Info() api.ProcessInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.info
}

// Attach subscribes to the events after afterSeq that are still buffered,
// then to live ones. The caller must Close the subscription.
func (p *Process) Attach(afterSeq uint64) *Subscription { return p.log.subscribe(afterSeq) }

// onExit runs on the reaper; it must not block.
func (p *Process) onExit(ws unix.WaitStatus) {
	p.ws = ws
	p.exitAt.Store(time.Now().UnixNano())
	close(p.exited)
}

// readLoop turns one output source into events until EOF (EIO for a
// terminal whose other side is closed) or, after the process exited, the
// drain deadline.
func (p *Process) readLoop(f *os.File, typ api.EventType) {
	buf := make([]byte, readChunk)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			p.log.appendOutput(api.Event{Type: typ, Data: bytes.Clone(buf[:n]), Time: time.Now()})
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// A reader woken late (a loaded host) sees the deadline even
			// when output is waiting: what the process wrote before it
			// exited must not be lost.
			p.drainBuffered(f, buf, typ)
			if p.groupGrowing() {
				_ = f.SetReadDeadline(time.Now().Add(drainIdle))
				continue
			}
		}
		if err != nil {
			return
		}
		if at := p.exitAt.Load(); at != 0 {
			_ = f.SetReadDeadline(drainDeadline(at))
		}
	}
}

// drainBuffered reads what f holds right now, without waiting, up to
// drainBufferedMax bytes (a child still writing is not followed).
func (p *Process) drainBuffered(f *os.File, buf []byte, typ api.EventType) {
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	_ = f.SetReadDeadline(time.Time{})
	for total := 0; total < drainBufferedMax; {
		n := 0
		if err := rc.Read(func(fd uintptr) bool {
			n, _ = unix.Read(int(fd), buf)
			return true // never wait for more
		}); err != nil || n <= 0 {
			return
		}
		p.log.appendOutput(api.Event{Type: typ, Data: bytes.Clone(buf[:n]), Time: time.Now()})
		total += n
	}
}

// groupGrowing reports, after the process exited, whether its tree has
// grown since then (a fork bomb whose first shell returned at once), for
// up to groupWaitMax after the exit. A tree that had left nothing at exit
// costs nothing; otherwise the pids cgroup's count is read at most every
// drainIdle, and the tree counted only when that count rose.
func (p *Process) groupGrowing() bool {
	at := p.exitAt.Load()
	if at == 0 || p.table == nil {
		return false
	}
	c := p.table.pids
	if c == nil || time.Since(time.Unix(0, at)) > groupWaitMax {
		return false
	}
	p.growMu.Lock()
	defer p.growMu.Unlock()
	if p.growTree == 0 {
		return false // nothing was left at exit
	}
	now := time.Now()
	if now.Sub(p.growAt) < drainIdle {
		return p.growing
	}
	p.growAt = now
	p.growing = false
	if n, err := c.current(); err == nil && n > p.growN {
		p.growing = len(treeOf(scanProcs(), p.pid)) > p.growTree
	}
	return p.growing
}

// noteTreeAtExit records, when p exited, the size of what it left running
// and the processes' task count: groupGrowing's baselines.
func (p *Process) noteTreeAtExit() {
	c := p.table.pids
	if c == nil || unix.Kill(-p.pid, 0) != nil {
		return
	}
	n, err := c.current()
	if err != nil {
		return
	}
	tree := len(treeOf(scanProcs(), p.pid))
	p.growMu.Lock()
	p.growN, p.growTree, p.growAt = n, tree, time.Now()
	p.growMu.Unlock()
}

func drainDeadline(exitAt int64) time.Time {
	idle, limit := time.Now().Add(drainIdle), time.Unix(0, exitAt).Add(drainMax)
	if idle.Before(limit) {
		return idle
	}
	return limit
}

// wait finishes the process once it is reaped: it drains its output, then
// logs the exit event, so all output precedes the exit.
func (p *Process) wait(readers *sync.WaitGroup, pio *procIO) {
	<-p.exited
	if p.timer != nil {
		p.timer.Stop()
	}
	p.noteTreeAtExit()
	for _, r := range pio.readers {
		_ = r.f.SetReadDeadline(drainDeadline(p.exitAt.Load()))
	}
	readers.Wait()
	// The limit may have refused this process's last fork just before it
	// ended: let the guard look now, so the status can say so.
	p.table.checkPids(false)
	p.stdinMu.Lock()
	pio.closeParent() // includes the terminal's master
	p.stdinClosed = true
	p.stdinMu.Unlock()

	st := p.status()
	p.mu.Lock()
	p.info.Exit = &st
	p.mu.Unlock()
	p.log.appendEvent(api.Event{Type: api.EventExit, PID: p.pid, Exit: &st, Time: time.Now()})
	p.table.finish(p)
	close(p.done)
	p.table.log.Debug("process ended", "pid", p.pid, "code", st.Code, "reason", st.Reason)
}

// status works out how the process ended.
func (p *Process) status() api.ExitStatus {
	ws := p.ws
	st := api.ExitStatus{Truncated: p.log.outputState()}
	p.mu.Lock()
	cause := p.cause
	p.mu.Unlock()
	if ws.Signaled() {
		sig := ws.Signal()
		st.Code = 128 + int(sig)
		st.Signal = unix.SignalName(sig)
		switch {
		case cause.reason != "":
			st.Reason, st.Message = cause.reason, cause.message
		case sig == unix.SIGKILL && p.kernelOOM():
			st.Reason, st.Message = api.ExitOOM, p.oomMessage()
		default:
			st.Reason = api.ExitSignaled
		}
	} else {
		st.Code = ws.ExitStatus()
		switch {
		case cause.reason != "":
			// The agent killed the rest of its tree (say, a fork bomb
			// whose first shell had returned).
			st.Reason, st.Message = cause.reason, cause.message
		case st.Code == 128+int(unix.SIGKILL) && p.kernelOOM():
			// A shell whose child the kernel OOM-killed exits 137 itself.
			st.Reason, st.Message = api.ExitOOM, p.oomMessage()
		}
	}
	if st.Reason == "" && st.Truncated {
		st.Reason = api.ExitOutputLimit
		st.Message = fmt.Sprintf("output exceeded the limit of %d bytes; the rest was dropped", p.outLimit)
	}
	return st
}

// kernelOOM reports whether the kernel OOM-killed something in the
// sandbox's memory cgroup since the process started.
func (p *Process) kernelOOM() bool {
	if !p.oomKnown {
		return false
	}
	n, ok := p.table.opts.OOMKills()
	return ok && n > p.oomBase
}

func (p *Process) oomMessage() string {
	if l := p.table.opts.MemoryLimit; l > 0 {
		return oomReason(l).message
	}
	return "out of memory: the sandbox reached its memory limit"
}

// kill SIGKILLs the process's whole tree, recording why (the first cause
// wins). A process that exited but is not done yet still has its group,
// which it kills: what is left of the tree is the process's doing.
func (p *Process) kill(cause exitCause) {
	select {
	case <-p.done:
		return
	default:
	}
	p.mu.Lock()
	if p.cause.reason == "" {
		p.cause = cause
	}
	p.mu.Unlock()
	killTree(p.pid)
}

// Signal sends a signal, by name ("SIGTERM", "TERM", "kill"), to the
// process's group.
func (p *Process) Signal(name string) error {
	sig := parseSignal(name)
	if sig == 0 {
		return apiErrorf(api.CodeInvalidArgument, "unknown signal %q", name)
	}
	select {
	case <-p.exited:
		return apiErrorf(api.CodeFailedPrecondition, "process %d has exited", p.pid)
	default:
	}
	if err := unix.Kill(-p.pid, sig); err != nil {
		if err := unix.Kill(p.pid, sig); err != nil {
			return fmt.Errorf("signalling process %d: %w", p.pid, err)
		}
	}
	return nil
}

func parseSignal(name string) unix.Signal {
	if name == "" {
		return 0
	}
	s := strings.ToUpper(name)
	if !strings.HasPrefix(s, "SIG") {
		s = "SIG" + s
	}
	return unix.SignalNum(s)
}

// Resize changes the size of the process's terminal.
func (p *Process) Resize(cols, rows uint16) error {
	if p.pty == nil {
		return apiErrorf(api.CodeFailedPrecondition, "process %d has no terminal", p.pid)
	}
	p.stdinMu.Lock() // the master is closed under it
	defer p.stdinMu.Unlock()
	if p.stdinClosed {
		return apiErrorf(api.CodeFailedPrecondition, "process %d has exited", p.pid)
	}
	if err := setSize(p.pty, cols, rows); err != nil {
		return apiErrorf(api.CodeInternal, "%v", err)
	}
	return nil
}

// WriteStdin writes data to the process's stdin and then closes it if
// close is set. On a terminal, closing sends the EOF character (^D), which
// ends input only at the start of a line.
func (p *Process) WriteStdin(ctx context.Context, data []byte, close bool) error {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdin == nil {
		return apiErrorf(api.CodeFailedPrecondition, "process %d was started without stdin", p.pid)
	}
	if p.stdinClosed {
		return apiErrorf(api.CodeFailedPrecondition, "stdin of process %d is closed", p.pid)
	}
	_ = p.stdin.SetWriteDeadline(time.Time{})
	stop := context.AfterFunc(ctx, func() { _ = p.stdin.SetWriteDeadline(time.Now()) })
	defer stop()
	if p.pty != nil && close {
		data = append(data[:len(data):len(data)], 4)
	}
	if _, err := p.stdin.Write(data); err != nil {
		switch {
		case errors.Is(err, unix.EPIPE):
			return apiErrorf(api.CodeFailedPrecondition, "process %d closed its stdin", p.pid)
		case errors.Is(err, os.ErrDeadlineExceeded) && ctx.Err() != nil:
			return ctx.Err()
		}
		return fmt.Errorf("writing stdin of process %d: %w", p.pid, err)
	}
	if close && p.pty == nil {
		p.stdinClosed = true
		return p.stdin.Close()
	}
	return nil
}
