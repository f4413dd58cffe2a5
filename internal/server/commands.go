package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// agentCallTimeout bounds the agent calls that are not streams.
const agentCallTimeout = 30 * time.Second

// maxAggregatedOutput bounds the output a command run with Accept:
// application/json may ask for, since it is held in memory.
const maxAggregatedOutput = 64 << 20

// errDetached ends following a background command once it started.
var errDetached = errors.New("detached")

func (s *Server) runCommand(w http.ResponseWriter, r *http.Request) error {
	if isWebSocket(r) {
		// A WebSocket handshake must be a GET: refuse before starting
		// anything, rather than run a command nobody can follow.
		return fmt.Errorf("WebSocket streams need GET: start the command with background:true, then GET .../commands/{pid}/events: %w", errdefs.ErrInvalidArgument)
	}
	var req api.CommandRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	p, err := s.execParams(req)
	if err != nil {
		return err
	}
	a, sb, err := s.agentFor(r)
	if err != nil {
		return err
	}
	if p.Cwd == "" {
		p.Cwd = sb.Workdir // the template's WORKDIR
	}
	switch {
	case req.Background:
		return s.startBackground(w, r, a, p)
	case wantsJSON(r):
		return s.runAggregated(w, r, a, p)
	}
	st := s.newStream(w, r)
	_, err = a.Exec(st.ctx, p, s.countExec(st.send))
	return st.finish(err)
}

// execParams validates a command request and applies the defaults.
func (s *Server) execParams(req api.CommandRequest) (wire.ExecParams, error) {
	p := wire.ExecParams{Args: req.Args, Cmd: req.Cmd, Cwd: req.Cwd, Env: req.Env, Tag: req.Tag, Stdin: req.Stdin}
	if err := checkArgv(req.Args, req.Cmd); err != nil {
		return p, err
	}
	if req.Cwd != "" {
		if err := checkPath("cwd", req.Cwd); err != nil {
			return p, err
		}
	}
	if err := sandbox.CheckEnv(req.Env); err != nil {
		return p, err
	}
	var err error
	if p.User, err = checkUser(req.User); err != nil {
		return p, err
	}
	if p.TimeoutMs, p.OutputLimit, err = s.commandLimits(req); err != nil {
		return p, err
	}
	if err := sandbox.CheckTag(req.Tag); err != nil {
		return p, err
	}
	if req.PTY != nil {
		if req.PTY.Cols == 0 || req.PTY.Rows == 0 {
			return p, invalid("pty size %dx%d: cols and rows must be positive", req.PTY.Cols, req.PTY.Rows)
		}
		p.PTY = &wire.PTYSize{Cols: req.PTY.Cols, Rows: req.PTY.Rows}
	}
	return p, nil
}

// commandLimits resolves a command's timeout (ms) and output cap against
// the server's defaults and ceilings.
func (s *Server) commandLimits(req api.CommandRequest) (timeoutMs, output int64, err error) {
	l := s.cfg.Limits
	switch max := l.MaxCommandTimeout.Seconds(); {
	case req.Timeout < 0 || req.Timeout > max || req.Timeout != req.Timeout:
		return 0, 0, invalid("timeout %v: want seconds in (0, %v], or 0 for the default (%v)", req.Timeout, max, l.DefaultCommandTimeout.Seconds())
	case req.Timeout == 0:
		timeoutMs = l.DefaultCommandTimeout.Milliseconds()
	default:
		timeoutMs = max64(1, int64(req.Timeout*1000))
	}
	switch {
	case req.OutputLimit < 0 || req.OutputLimit > l.MaxOutputBytes:
		return 0, 0, invalid("output_limit %d: want bytes in [1, %d], or 0 for the default", req.OutputLimit, l.MaxOutputBytes)
	case req.OutputLimit == 0:
		output = l.DefaultOutputBytes
	default:
		output = req.OutputLimit
	}
	return timeoutMs, output, nil
}

func checkArgv(args []string, cmd string) error {
	switch {
	case (len(args) == 0) == (cmd == ""):
		return invalid("exactly one of args and cmd must be set")
	case len(args) > 0 && args[0] == "":
		return invalid("args[0] must name a program")
	case len(args) > 4096:
		return invalid("more than 4096 args")
	case strings.ContainsRune(cmd, 0):
		return invalid("cmd contains a NUL byte")
	}
	for i, a := range args {
		if strings.ContainsRune(a, 0) {
			return invalid("args[%d] contains a NUL byte", i)
		}
	}
	return nil
}

func max64(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}

// wantsJSON reports whether the client asked for the aggregated result
// rather than a stream.
func wantsJSON(r *http.Request) bool {
	for _, part := range strings.Split(r.Header.Get("Accept"), ",") {
		if mt, _, err := mime.ParseMediaType(strings.TrimSpace(part)); err == nil && mt == "application/json" {
			return true
		}
	}
	return false
}

// countExec counts commands as they start and end, for metrics.
func (s *Server) countExec(emit func(api.Event) error) func(api.Event) error {
	return func(ev api.Event) error {
		switch ev.Type {
		case api.EventStart:
			s.metrics.CommandStarted()
		case api.EventExit:
			s.metrics.CommandFinished(ev.Exit)
		}
		return emit(ev)
	}
}

// startBackground starts a command, answers its pid and leaves it
// running detached.
func (s *Server) startBackground(w http.ResponseWriter, r *http.Request, a *sandbox.Agent, p wire.ExecParams) error {
	pid := 0
	_, err := a.Exec(r.Context(), p, s.countExec(func(ev api.Event) error {
		if ev.Type == api.EventStart {
			pid = ev.PID
			return errDetached
		}
		return nil
	}))
	if pid == 0 {
		if err == nil {
			err = errors.New("command ended without a start event")
		}
		return fmt.Errorf("starting command: %w", err)
	}
	return writeJSON(w, http.StatusAccepted, api.CommandStarted{PID: pid})
}

// runAggregated runs a command to its end and answers all its output.
func (s *Server) runAggregated(w http.ResponseWriter, r *http.Request, a *sandbox.Agent, p wire.ExecParams) error {
	if p.OutputLimit > maxAggregatedOutput {
		return invalid("output_limit %d: at most %d bytes with Accept: application/json; use a stream", p.OutputLimit, maxAggregatedOutput)
	}
	var res api.CommandResult
	var stdout, stderr strings.Builder
	exit, err := a.Exec(r.Context(), p, s.countExec(func(ev api.Event) error {
		switch ev.Type {
		case api.EventStart:
			res.PID = ev.PID
		case api.EventStdout:
			stdout.Write(ev.Data)
		case api.EventStderr:
			stderr.Write(ev.Data)
		}
		return nil
	}))
	if err != nil {
		return fmt.Errorf("running command: %w", err)
	}
	res.Stdout, res.Stderr, res.Exit = stdout.String(), stderr.String(), *exit
	return writeJSON(w, http.StatusOK, res)
}

func (s *Server) listCommands(w http.ResponseWriter, r *http.Request) error {
	return listFromAgent(s, w, r, "commands", (*sandbox.Agent).Processes)
}

// listFromAgent answers a GET with what one agent call lists; never null.
func listFromAgent[T any](s *Server, w http.ResponseWriter, r *http.Request, what string,
	list func(*sandbox.Agent, context.Context) ([]T, error)) error {
	a, err := s.agent(r)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(r.Context(), agentCallTimeout)
	defer cancel()
	items, err := list(a, ctx)
	if err != nil {
		return fmt.Errorf("listing %s: %w", what, err)
	}
	if items == nil {
		items = []T{}
	}
	return writeJSON(w, http.StatusOK, items)
}

// commandEvents re-attaches to a command: events after ?after_seq, then
// live ones.
func (s *Server) commandEvents(w http.ResponseWriter, r *http.Request) error {
	p, err := attachParams(r)
	if err != nil {
		return err
	}
	a, err := s.agent(r)
	if err != nil {
		return err
	}
	st := s.newStream(w, r)
	_, err = a.Attach(st.ctx, p, st.send)
	return st.finish(err)
}

func attachParams(r *http.Request) (wire.AttachParams, error) {
	q := r.URL.Query()
	if err := checkQuery(q, "after_seq"); err != nil {
		return wire.AttachParams{}, err
	}
	pid, err := pidParam(r)
	if err != nil {
		return wire.AttachParams{}, err
	}
	p := wire.AttachParams{PID: pid}
	if v := q.Get("after_seq"); v != "" {
		if p.AfterSeq, err = strconv.ParseUint(v, 10, 64); err != nil {
			return p, invalid("after_seq %q: want a non-negative integer", errdefs.ClipN(v, 32))
		}
	}
	return p, nil
}

// stdinChunk is the most stdin sent in one agent call; it fits one
// channel frame after base64.
const stdinChunk = 64 << 10

// commandStdin streams the request body to a command's stdin.
func (s *Server) commandStdin(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	if err := checkQuery(q, "close"); err != nil {
		return err
	}
	closeIn, err := boolParam(q, "close")
	if err != nil {
		return err
	}
	pid, err := pidParam(r)
	if err != nil {
		return err
	}
	a, err := s.agent(r)
	if err != nil {
		return err
	}
	if err := sendStdin(r.Context(), a, pid, r.Body, closeIn); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func sendStdin(ctx context.Context, a *sandbox.Agent, pid int, body io.Reader, closeIn bool) error {
	buf := make([]byte, stdinChunk)
	for {
		n, rerr := io.ReadFull(body, buf)
		eof := errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF)
		if rerr != nil && !eof {
			return fmt.Errorf("reading stdin body: %w", rerr)
		}
		if n > 0 || (eof && closeIn) {
			cctx, cancel := context.WithTimeout(ctx, agentCallTimeout)
			err := a.Stdin(cctx, wire.StdinParams{PID: pid, Data: buf[:n], Close: eof && closeIn})
			cancel()
			if err != nil {
				return fmt.Errorf("writing stdin: %w", err)
			}
		}
		if eof {
			return nil
		}
	}
}

// signals are the signals a caller may send, by name.
var signals = map[string]bool{
	"SIGTERM": true, "SIGKILL": true, "SIGINT": true, "SIGHUP": true, "SIGQUIT": true,
	"SIGUSR1": true, "SIGUSR2": true, "SIGSTOP": true, "SIGCONT": true, "SIGTSTP": true,
	"SIGWINCH": true, "SIGALRM": true, "SIGPIPE": true,
}

func (s *Server) signalCommand(w http.ResponseWriter, r *http.Request) error {
	var req api.SignalRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	sig := strings.ToUpper(req.Signal)
	if !strings.HasPrefix(sig, "SIG") {
		sig = "SIG" + sig
	}
	if !signals[sig] {
		return invalid("signal %q: want a name such as SIGTERM, SIGKILL or SIGINT", errdefs.ClipN(req.Signal, 32))
	}
	return s.unaryCommand(w, r, func(ctx context.Context, a *sandbox.Agent, pid int) error {
		return a.Signal(ctx, wire.SignalParams{PID: pid, Signal: sig})
	})
}

func (s *Server) resizeCommand(w http.ResponseWriter, r *http.Request) error {
	var req api.PTYSize
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	if req.Cols == 0 || req.Rows == 0 {
		return invalid("size %dx%d: cols and rows must be positive", req.Cols, req.Rows)
	}
	return s.unaryCommand(w, r, func(ctx context.Context, a *sandbox.Agent, pid int) error {
		return a.Resize(ctx, wire.ResizeParams{PID: pid, Size: wire.PTYSize{Cols: req.Cols, Rows: req.Rows}})
	})
}

// unaryCommand runs call on the {pid} of the caller's sandbox {id} and
// answers 204.
func (s *Server) unaryCommand(w http.ResponseWriter, r *http.Request, call func(context.Context, *sandbox.Agent, int) error) error {
	pid, err := pidParam(r)
	if err != nil {
		return err
	}
	a, err := s.agent(r)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(r.Context(), agentCallTimeout)
	defer cancel()
	if err := call(ctx, a, pid); err != nil {
		return fmt.Errorf("%s command %d: %w", strings.TrimPrefix(r.Pattern, "POST /v1/sandboxes/{id}/commands/{pid}/"), pid, err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
