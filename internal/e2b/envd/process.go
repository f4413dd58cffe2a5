package envd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/channel"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/e2b/envd/spec/process"
	"github.com/kiln-sh/kiln/internal/e2b/envd/spec/process/processconnect"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// processService is process.Process on top of the agent's processes.
type processService struct{ h *Handler }

var _ processconnect.ProcessHandler = processService{}

// Start starts a process and streams its events. The request's deadline
// (Connect-Timeout-Ms) is the process's lifetime, as in envd; closing
// the stream early leaves it running.
func (s processService) Start(ctx context.Context, req *connect.Request[process.StartRequest], stream *connect.ServerStream[process.StartResponse]) error {
	t := targetOf(ctx)
	user, err := rpcUser(req.Header(), t.sb)
	if err != nil {
		return err
	}
	m := req.Msg
	cfg := m.GetProcess()
	if cfg.GetCmd() == "" {
		return rpcErrorf(connect.CodeInvalidArgument, "process.cmd is required")
	}
	// The same checks as the native API's commands.
	if err := errors.Join(sandbox.CheckEnv(cfg.GetEnvs()), sandbox.CheckTag(m.GetTag())); err != nil {
		return rpcError(err)
	}
	p := wire.ExecParams{
		Args:  append([]string{cfg.GetCmd()}, cfg.GetArgs()...),
		Env:   cfg.GetEnvs(),
		Cwd:   expandPath(cfg.GetCwd(), t.sb),
		User:  user,
		Tag:   m.GetTag(),
		Stdin: m.Stdin == nil || m.GetStdin(),

		OutputLimit: s.h.outLimit,
	}
	if dl, ok := ctx.Deadline(); ok {
		p.TimeoutMs = max(1, time.Until(dl).Milliseconds())
	}
	if pty := m.GetPty(); pty != nil {
		p.PTY = &wire.PTYSize{Cols: clampSize(pty.GetSize().GetCols(), 80), Rows: clampSize(pty.GetSize().GetRows(), 24)}
	}
	if b, _ := json.Marshal(p); len(b) > maxExecParams {
		return rpcErrorf(connect.CodeInvalidArgument, "the command, its arguments and environment take %d bytes, more than %d: write a script with files.write and run that", len(b), maxExecParams)
	}
	ps := newProcStream(req.Header(), p.PTY != nil, func(ev *process.ProcessEvent) error {
		return stream.Send(&process.StartResponse{Event: ev})
	})
	defer ps.stop()
	ps.deadline = p.TimeoutMs > 0
	st, err := t.agent.Exec(ctx, p, ps.emit)
	if err != nil && !ps.started {
		return startError(ctx, t, p, err)
	}
	return ps.finish(ctx, st, err)
}

// startError is what envd answers when a process cannot start: invalid
// argument, with its message for a missing working directory.
func startError(ctx context.Context, t *target, p wire.ExecParams, err error) error {
	abortIfGone(err)
	if errors.Is(err, errdefs.ErrNotFound) && p.Cwd != "" {
		if _, serr := t.agent.Stat(ctx, wire.PathParams{Path: p.Cwd, User: p.User}); errors.Is(serr, errdefs.ErrNotFound) {
			return rpcErrorf(connect.CodeInvalidArgument, "cwd '%s' does not exist", errdefs.Clip(p.Cwd))
		}
	}
	switch {
	case errors.Is(err, errdefs.ErrNotFound), errors.Is(err, errdefs.ErrInvalidArgument),
		errors.Is(err, errdefs.ErrPermissionDenied), errors.Is(err, errdefs.ErrFailedPrecondition):
		return rpcErrorf(connect.CodeInvalidArgument, "error starting process: %s", message(err, errdefs.ClassOf(err)))
	}
	return rpcError(err)
}

// Connect re-attaches to a running (or recently ended) process: a start
// event, its buffered output, then live output and the end event.
func (s processService) Connect(ctx context.Context, req *connect.Request[process.ConnectRequest], stream *connect.ServerStream[process.ConnectResponse]) error {
	t := targetOf(ctx)
	pid, err := t.pid(ctx, req.Msg.GetProcess())
	if err != nil {
		return err
	}
	info, err := t.process(ctx, pid)
	if err != nil {
		return err
	}
	ps := newProcStream(req.Header(), info.PTY, func(ev *process.ProcessEvent) error {
		return stream.Send(&process.ConnectResponse{Event: ev})
	})
	defer ps.stop()
	if err := ps.emit(api.Event{Type: api.EventStart, PID: pid}); err != nil {
		return err
	}
	st, err := t.agent.Attach(ctx, wire.AttachParams{PID: pid}, ps.emit)
	return ps.finish(ctx, st, err)
}

// List lists the running processes.
func (s processService) List(ctx context.Context, req *connect.Request[process.ListRequest]) (*connect.Response[process.ListResponse], error) {
	infos, err := targetOf(ctx).agent.Processes(ctx)
	if err != nil {
		return nil, rpcError(err)
	}
	out := &process.ListResponse{Processes: []*process.ProcessInfo{}}
	for _, in := range infos {
		if in.Exit != nil || len(in.Args) == 0 {
			continue
		}
		pi := &process.ProcessInfo{
			Pid: uint32(in.PID),
			Config: &process.ProcessConfig{Cmd: in.Args[0], Args: in.Args[1:], Envs: in.Env,
				Cwd: optional(in.Cwd)},
			Tag: optional(in.Tag),
		}
		out.Processes = append(out.Processes, pi)
	}
	return connect.NewResponse(out), nil
}

// Update resizes a process's terminal.
func (s processService) Update(ctx context.Context, req *connect.Request[process.UpdateRequest]) (*connect.Response[process.UpdateResponse], error) {
	t := targetOf(ctx)
	pid, err := t.pid(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if size := req.Msg.GetPty().GetSize(); size != nil {
		err = t.agent.Resize(ctx, wire.ResizeParams{PID: pid,
			Size: wire.PTYSize{Cols: clampSize(size.GetCols(), 80), Rows: clampSize(size.GetRows(), 24)}})
	}
	return connect.NewResponse(&process.UpdateResponse{}), t.ended(ctx, pid, err)
}

// SendInput writes to a process's stdin or terminal.
func (s processService) SendInput(ctx context.Context, req *connect.Request[process.SendInputRequest]) (*connect.Response[process.SendInputResponse], error) {
	t := targetOf(ctx)
	pid, err := t.pid(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.SendInputResponse{}), t.input(ctx, pid, req.Msg.GetInput())
}

// StreamInput writes a client stream of inputs, in order, to one process:
// a start event names it, data events follow.
func (s processService) StreamInput(ctx context.Context, stream *connect.ClientStream[process.StreamInputRequest]) (*connect.Response[process.StreamInputResponse], error) {
	t := targetOf(ctx)
	pid := 0
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *process.StreamInputRequest_Start:
			var err error
			if pid, err = t.pid(ctx, ev.Start.GetProcess()); err != nil {
				return nil, err
			}
		case *process.StreamInputRequest_Data:
			if pid == 0 {
				return nil, rpcErrorf(connect.CodeFailedPrecondition, "the stream must start with a start event naming the process")
			}
			if err := t.input(ctx, pid, ev.Data.GetInput()); err != nil {
				return nil, err
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.StreamInputResponse{}), nil
}

// SendSignal sends SIGTERM or SIGKILL to a process's group.
func (s processService) SendSignal(ctx context.Context, req *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	t := targetOf(ctx)
	var sig string
	switch req.Msg.GetSignal() {
	case process.Signal_SIGNAL_SIGKILL:
		sig = "SIGKILL"
	case process.Signal_SIGNAL_SIGTERM:
		sig = "SIGTERM"
	default:
		return nil, rpcErrorf(connect.CodeInvalidArgument, "invalid signal: %s", req.Msg.GetSignal())
	}
	pid, err := t.pid(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	err = t.agent.Signal(ctx, wire.SignalParams{PID: pid, Signal: sig})
	return connect.NewResponse(&process.SendSignalResponse{}), t.ended(ctx, pid, err)
}

// CloseStdin closes a process's stdin (on a terminal: sends ^D).
func (s processService) CloseStdin(ctx context.Context, req *connect.Request[process.CloseStdinRequest]) (*connect.Response[process.CloseStdinResponse], error) {
	t := targetOf(ctx)
	pid, err := t.pid(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	err = t.agent.Stdin(ctx, wire.StdinParams{PID: pid, Close: true})
	return connect.NewResponse(&process.CloseStdinResponse{}), t.ended(ctx, pid, err)
}

func (t *target) input(ctx context.Context, pid int, in *process.ProcessInput) error {
	var data []byte
	switch v := in.GetInput().(type) {
	case *process.ProcessInput_Stdin:
		data = v.Stdin
	case *process.ProcessInput_Pty:
		data = v.Pty
	default:
		return rpcErrorf(connect.CodeInvalidArgument, "input must be stdin or pty")
	}
	// One agent call carries at most a channel frame: write in pieces,
	// each within stdinTimeout (as the native API's stdin), so input to
	// a process that does not read it fails rather than waits forever.
	for first := true; first || len(data) > 0; first = false {
		n := min(len(data), stdinChunk)
		cctx, cancel := context.WithTimeout(ctx, stdinTimeout)
		err := t.agent.Stdin(cctx, wire.StdinParams{PID: pid, Data: data[:n]})
		timedOut := cctx.Err() != nil && ctx.Err() == nil
		cancel()
		if err != nil {
			if timedOut {
				return rpcErrorf(connect.CodeDeadlineExceeded, "process %d did not read its input within %v", pid, stdinTimeout)
			}
			return t.ended(ctx, pid, err)
		}
		data = data[n:]
	}
	return nil
}

// stdinTimeout bounds the write of one piece of input: how long a
// process may leave its stdin unread before SendInput fails.
const stdinTimeout = 30 * time.Second

// maxExecParams is about the largest process description one agent call
// carries.
const maxExecParams = channel.MaxCall - 1024

// stdinChunk is the most input one agent call carries (base64 in JSON
// must fit a channel frame of 256 KiB).
const stdinChunk = 64 << 10

// pid resolves a process selector: a pid as given, a tag to the running
// process that carries it.
func (t *target) pid(ctx context.Context, sel *process.ProcessSelector) (int, error) {
	switch s := sel.GetSelector().(type) {
	case *process.ProcessSelector_Pid:
		if s.Pid == 0 || s.Pid > math.MaxInt32 {
			return 0, rpcErrorf(connect.CodeNotFound, "process with pid %d not found", s.Pid)
		}
		return int(s.Pid), nil
	case *process.ProcessSelector_Tag:
		infos, err := t.agent.Processes(ctx)
		if err != nil {
			return 0, rpcError(err)
		}
		for i := len(infos) - 1; i >= 0; i-- {
			if infos[i].Tag == s.Tag && infos[i].Exit == nil {
				return infos[i].PID, nil
			}
		}
		return 0, rpcErrorf(connect.CodeNotFound, "process with tag %s not found", errdefs.Clip(s.Tag))
	}
	return 0, rpcErrorf(connect.CodeInvalidArgument, "a process selector (pid or tag) is required")
}

// process describes the process pid, running or recently ended.
func (t *target) process(ctx context.Context, pid int) (api.ProcessInfo, error) {
	infos, err := t.agent.Processes(ctx)
	if err != nil {
		return api.ProcessInfo{}, rpcError(err)
	}
	for _, in := range infos {
		if in.PID == pid {
			return in, nil
		}
	}
	return api.ProcessInfo{}, rpcErrorf(connect.CodeNotFound, "process with pid %d not found", pid)
}

// ended converts an error of an operation on pid: envd forgets processes
// once they end, so an operation on an ended one is not_found there (and
// the SDK's kill() returns false on it).
func (t *target) ended(ctx context.Context, pid int, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, errdefs.ErrFailedPrecondition) {
		if in, ierr := t.process(ctx, pid); ierr == nil && in.Exit != nil {
			return rpcErrorf(connect.CodeNotFound, "process with pid %d not found", pid)
		}
	}
	return rpcError(err)
}

func clampSize(v uint32, def uint16) uint16 {
	switch {
	case v == 0:
		return def
	case v > math.MaxUint16:
		return math.MaxUint16
	}
	return uint16(v)
}

func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// procStream turns the agent's process events into envd's: one start
// event, data events (stdout, stderr, or pty for a terminal), keepalives
// whenever nothing else was sent for the client's Keepalive-Ping-Interval,
// and the end event.
type procStream struct {
	send     func(*process.ProcessEvent) error
	pty      bool
	keepStop func()
	// deadline: the process's timeout is the request's deadline, so its
	// timeout kill ends the stream as deadline_exceeded (as envd's does,
	// where the request context ends first), not with an end event.
	deadline bool

	mu      sync.Mutex
	started bool
	ended   bool
	reset   chan struct{}
}

func newProcStream(h headerGetter, pty bool, send func(*process.ProcessEvent) error) *procStream {
	ps := &procStream{send: send, pty: pty, reset: make(chan struct{}, 1)}
	ps.keepStop = keepalive(keepaliveInterval(h), ps.reset, func() error {
		return ps.sendLocked(&process.ProcessEvent{Event: &process.ProcessEvent_Keepalive{Keepalive: &process.ProcessEvent_KeepAlive{}}})
	})
	return ps
}

func (ps *procStream) stop() { ps.keepStop() }

// sendLocked sends one event under the stream's lock (Send is not safe
// for concurrent use).
func (ps *procStream) sendLocked(ev *process.ProcessEvent) error {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.send(ev)
}

func (ps *procStream) emit(ev api.Event) error {
	var out *process.ProcessEvent
	switch ev.Type {
	case api.EventStart:
		if ps.started {
			return nil
		}
		ps.started = true
		out = &process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: uint32(ev.PID)}}}
	case api.EventStdout, api.EventStderr:
		data := &process.ProcessEvent_DataEvent{}
		switch {
		case ps.pty:
			data.Output = &process.ProcessEvent_DataEvent_Pty{Pty: ev.Data}
		case ev.Type == api.EventStdout:
			data.Output = &process.ProcessEvent_DataEvent_Stdout{Stdout: ev.Data}
		default:
			data.Output = &process.ProcessEvent_DataEvent_Stderr{Stderr: ev.Data}
		}
		out = &process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: data}}
	case api.EventExit:
		if ev.Exit == nil || ps.ended {
			return nil
		}
		ps.ended = true
		if ps.deadline && ev.Exit.Reason == api.ExitTimeout {
			return deadlineError()
		}
		out = &process.ProcessEvent{Event: &process.ProcessEvent_End{End: endEvent(ev.Exit)}}
	default:
		return nil
	}
	if err := ps.sendLocked(out); err != nil {
		return err
	}
	select {
	case ps.reset <- struct{}{}:
	default:
	}
	return nil
}

// finish ends the stream once the agent's call returned: the end event if
// the process ended and it was not sent yet, else the call's error.
func (ps *procStream) finish(ctx context.Context, st *api.ExitStatus, err error) error {
	if err != nil {
		abortIfGone(err)
		if cerr := ctx.Err(); cerr != nil {
			return rpcError(cerr)
		}
		return rpcError(err)
	}
	if st != nil {
		return ps.emit(api.Event{Type: api.EventExit, Exit: st})
	}
	return nil
}

// deadlineError ends a Start stream whose process its deadline killed.
func deadlineError() error {
	return connect.NewError(connect.CodeDeadlineExceeded, errors.New("the request's deadline passed: the process was killed"))
}

// endEvent describes how a process ended the way Go's os.ProcessState
// does, which is what envd sends and the SDKs show: "exit status 3", or
// "signal: killed" with exit code -1.
func endEvent(st *api.ExitStatus) *process.ProcessEvent_EndEvent {
	if st.Signal != "" {
		status := "signal: " + unix.SignalNum(st.Signal).String()
		return &process.ProcessEvent_EndEvent{ExitCode: -1, Exited: false, Status: status, Error: &status}
	}
	status := fmt.Sprintf("exit status %d", st.Code)
	end := &process.ProcessEvent_EndEvent{ExitCode: int32(st.Code), Exited: true, Status: status}
	if st.Code != 0 {
		end.Error = &status
	}
	return end
}
