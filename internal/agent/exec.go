package agent

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agent/process"
	"github.com/kiln-sh/kiln/internal/agentapi/channel"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
)

// shells run ExecParams.Cmd: bash as a login shell, else POSIX sh.
var shells = [][]string{{"/bin/bash", "-lc"}, {"/usr/bin/bash", "-lc"}, {"/bin/sh", "-c"}}

// exec starts a process and follows it until it exits or the stream is
// closed (which detaches: the process runs on).
func (s *Server) exec(ctx context.Context, st *channel.Stream, p wire.ExecParams) (any, error) {
	if (len(p.Args) == 0) == (p.Cmd == "") {
		return nil, &api.Error{Code: api.CodeInvalidArgument, Message: "exec needs exactly one of args and cmd"}
	}
	if p.TimeoutMs < 0 || p.OutputLimit < 0 {
		return nil, &api.Error{Code: api.CodeInvalidArgument, Message: "timeout and output limit must not be negative"}
	}
	acct, err := lookupAccount(p.User)
	if err != nil {
		return nil, err
	}
	args := p.Args
	if p.Cmd != "" {
		args = shellArgs(p.Cmd)
	} else if err := checkRunnable(args[0]); err != nil {
		return nil, err
	}
	spec := process.Spec{
		Args:        args,
		Env:         p.Env,
		Dir:         p.Cwd,
		User:        acct.processUser(),
		Tag:         p.Tag,
		Timeout:     time.Duration(p.TimeoutMs) * time.Millisecond,
		OutputLimit: p.OutputLimit,
		Stdin:       p.Stdin,
	}
	if p.PTY != nil {
		spec.PTY = &process.Size{Cols: p.PTY.Cols, Rows: p.PTY.Rows}
	}
	proc, sub, err := s.procs.Start(spec)
	if err != nil {
		return nil, err
	}
	defer sub.Close()
	s.log.Debug("exec", "pid", proc.PID(), "tag", p.Tag)
	return follow(ctx, st, sub)
}

// checkRunnable refuses a program named by path that exists but cannot
// be run (a directory, a file without execute bits): that is the caller's
// mistake about the file (permission denied), not a missing program.
func checkRunnable(name string) error {
	if !strings.Contains(name, "/") {
		return nil // looked up in PATH: absent is not found
	}
	fi, err := os.Stat(name)
	switch {
	case err != nil:
		return nil // the start reports it
	case fi.IsDir():
		return &api.Error{Code: api.CodeInvalidArgument, Message: fmt.Sprintf("cannot run %s: is a directory", name)}
	case !fi.Mode().IsRegular():
		return &api.Error{Code: api.CodeInvalidArgument, Message: fmt.Sprintf("cannot run %s: not a regular file", name)}
	case fi.Mode()&0o111 == 0:
		return &api.Error{Code: api.CodePermissionDenied, Message: fmt.Sprintf("cannot run %s: it is not executable (mode %04o)", name, fi.Mode().Perm())}
	}
	return nil
}

func shellArgs(cmd string) []string {
	for _, sh := range shells {
		if isFile(sh[0]) {
			return append(sh[:2:2], cmd)
		}
	}
	return []string{"sh", "-c", cmd}
}

// attach replays a process's buffered events after AfterSeq, then follows.
func (s *Server) attach(ctx context.Context, st *channel.Stream, p wire.AttachParams) (any, error) {
	proc, err := s.procs.Get(p.PID)
	if err != nil {
		return nil, err
	}
	sub := proc.Attach(p.AfterSeq)
	defer sub.Close()
	return follow(ctx, st, sub)
}

// follow streams a subscription's events; the result is the exit status.
func follow(ctx context.Context, st *channel.Stream, sub *process.Subscription) (any, error) {
	status, err := sub.Follow(ctx, func(ev api.Event) error { return st.SendEvent(ctx, ev) })
	if err != nil {
		return nil, err
	}
	return status, nil
}

func (s *Server) stdin(ctx context.Context, p wire.StdinParams) error {
	proc, err := s.procs.Get(p.PID)
	if err != nil {
		return err
	}
	return proc.WriteStdin(ctx, p.Data, p.Close)
}

func (s *Server) signal(p wire.SignalParams) error {
	proc, err := s.procs.Get(p.PID)
	if err != nil {
		return err
	}
	return proc.Signal(p.Signal)
}

func (s *Server) resize(p wire.ResizeParams) error {
	proc, err := s.procs.Get(p.PID)
	if err != nil {
		return err
	}
	return proc.Resize(p.Size.Cols, p.Size.Rows)
}
