package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"

	"golang.org/x/sys/unix"
)

// hostileSignals are the signals anything inside the sandbox could send
// the agent (root there may signal PID 1). Each is caught and dropped: a
// default disposition would stop the agent (TSTP, TTIN, TTOU), end it
// (HUP, INT, TERM, PIPE, ALRM, USR1, USR2, XCPU, XFSZ, VTALRM, IO, PWR,
// STKFLT) or make Go's runtime exit with a stack dump (QUIT, ABRT, ILL,
// TRAP, SYS, and SEGV, BUS and FPE when kill(2) sent them: Go turns only a
// real fault into a panic, and exits on a sent one unless it is notified).
// They are handled rather than ignored because an ignored disposition is
// inherited by every process the agent starts.
//
// Not here: SIGKILL and SIGSTOP, which cannot be caught (the host's
// liveness ping notices their effect); SIGCHLD, which the process table's
// reaper takes; SIGURG and SIGPROF, which Go's runtime uses and which do
// not end a program; SIGCONT and SIGWINCH, harmless by default.
var hostileSignals = []os.Signal{
	unix.SIGHUP, unix.SIGINT, unix.SIGQUIT, unix.SIGILL, unix.SIGTRAP, unix.SIGABRT,
	unix.SIGBUS, unix.SIGFPE, unix.SIGUSR1, unix.SIGSEGV, unix.SIGUSR2, unix.SIGPIPE,
	unix.SIGALRM, unix.SIGTERM, unix.SIGSTKFLT, unix.SIGTSTP, unix.SIGTTIN, unix.SIGTTOU,
	unix.SIGXCPU, unix.SIGXFSZ, unix.SIGVTALRM, unix.SIGIO, unix.SIGPWR, unix.SIGSYS,
}

// stopSignals stop an agent that is not PID 1 gracefully (the agent under
// test, or run by hand). PID 1 in a sandbox ignores them: the host stops
// a sandbox with SIGKILL, so only code in the sandbox sends them.
var stopSignals = []os.Signal{unix.SIGTERM, unix.SIGINT}

// handleSignals catches every hostile signal and logs it at debug level
// (a flood fills the channel and the rest is dropped, never queued). The
// returned context ends on a stop signal when pid1 is false; as PID 1
// nothing ends it. stop releases the handlers.
func handleSignals(log *slog.Logger, pid1 bool) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, hostileSignals...)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case sig := <-sigs:
				if !pid1 && isStopSignal(sig) {
					log.Info("stopping on signal", "signal", sig.String())
					cancel()
					continue
				}
				log.Debug("ignoring signal", "signal", sig.String())
			case <-done:
				return
			}
		}
	}()
	return ctx, func() {
		signal.Stop(sigs)
		close(done)
		cancel()
	}
}

func isStopSignal(sig os.Signal) bool {
	for _, s := range stopSignals {
		if sig == s {
			return true
		}
	}
	return false
}
