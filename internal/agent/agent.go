// Package agent is kiln-agent's server: it answers the host's calls on the
// channel (package channel) by dispatching each wire method (package wire)
// to the process table (package process) or the file operations (package
// files).
//
// Everything under internal/agent runs inside the sandbox: it imports only
// the standard library, golang.org/x/sys, api and internal/agent/...
package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"runtime/debug"
	"sync"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agent/files"
	"github.com/kiln-sh/kiln/internal/agent/kernel"
	"github.com/kiln-sh/kiln/internal/agent/process"
	"github.com/kiln-sh/kiln/internal/agentapi/channel"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
)

// Version is the agent's build version, reported in the channel handshake
// and by ping. Set with -ldflags "-X github.com/kiln-sh/kiln/internal/agent.Version=…".
var Version = "dev"

// Server serves the agent's methods.
type Server struct {
	cfg   Config
	log   *slog.Logger
	procs *process.Table
	files *files.Service
	// contexts holds the code contexts (kernels); see code.go.
	contexts *kernel.Contexts

	idMu      sync.Mutex // guards sandboxID and env; see identify.go
	sandboxID string
	env       []string // the sandbox's environment, without KILN_*
}

// New returns a Server; its process table (reaper, OOM guard) runs until
// Close.
func New(cfg Config, log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, log: log, sandboxID: cfg.SandboxID, env: cfg.BaseEnv}
	s.procs = process.NewTable(process.Options{
		Log:         log.With("component", "process"),
		BaseEnv:     s.baseEnv(),
		PathDir:     cfg.PathDir,
		OutputLimit: cfg.OutputLimit,
		ReplayBytes: cfg.ReplayBytes,
		History:     cfg.History,
		ReapAll:     cfg.ReapAll,
		MemoryLimit: cfg.MemoryLimit,
		OOMGuard:    cfg.OOMGuard,
		PidsLimit:   cfg.PidsLimit,
		PidsCgroup:  cfg.PidsCgroup,
	})
	s.files = files.New(log.With("component", "files"))
	s.contexts = newContexts(s)
	return s
}

// Serve answers the host on the channel carried by r and w (the agent's
// stdin and stdout) until r fails or ctx is done, and the code
// interpreter's health check if configured (Config.CodeHealth).
func (s *Server) Serve(ctx context.Context, r io.Reader, w io.Writer) error {
	if s.cfg.CodeHealth != "" {
		hctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go s.serveCodeHealth(hctx, s.cfg.CodeHealth)
	}
	return channel.Serve(ctx, r, w, Version, s.Handle)
}

// Close terminates every process (SIGTERM, then SIGKILL once ctx is done)
// and stops the reaper.
func (s *Server) Close(ctx context.Context) error {
	_ = s.contexts.Close()
	return s.procs.Close(ctx)
}

// Handle serves one call; it is a channel.HandlerFunc. A method that
// panics fails its own call with an internal error, logged with its
// stack; the agent (PID 1: the sandbox) lives on.
func (s *Server) Handle(ctx context.Context, st *channel.Stream, method string, params json.RawMessage) (res any, err error) {
	defer func() {
		if r := recover(); r != nil {
			s.log.Error(panicMessage, "method", method, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			res, err = nil, &api.Error{Code: api.CodeInternal, Message: "internal error in the sandbox agent serving " + method}
		}
	}()
	return s.handle(ctx, st, method, params)
}

// panicMessage is the log message of a recovered panic.
const panicMessage = "agent method panicked"

func (s *Server) handle(ctx context.Context, st *channel.Stream, method string, params json.RawMessage) (any, error) {
	switch method {
	case wire.MethodPing:
		return wire.Pong{Agent: Version}, nil
	case wire.MethodIdentify:
		return call(params, func(p wire.IdentifyParams) (any, error) { return nil, s.identify(ctx, p) })
	case wire.MethodExec:
		return call(params, func(p wire.ExecParams) (any, error) { return s.exec(ctx, st, p) })
	case wire.MethodAttach:
		return call(params, func(p wire.AttachParams) (any, error) { return s.attach(ctx, st, p) })
	case wire.MethodStdin:
		return call(params, func(p wire.StdinParams) (any, error) { return nil, s.stdin(ctx, p) })
	case wire.MethodSignal:
		return call(params, func(p wire.SignalParams) (any, error) { return nil, s.signal(p) })
	case wire.MethodResize:
		return call(params, func(p wire.ResizeParams) (any, error) { return nil, s.resize(p) })
	case wire.MethodProcesses:
		return s.procs.List(), nil
	case wire.MethodStat:
		return call(params, func(p wire.PathParams) (any, error) { return s.stat(ctx, p) })
	case wire.MethodList:
		return call(params, func(p wire.ListParams) (any, error) { return nil, s.list(ctx, st, p) })
	case wire.MethodMkdir:
		return call(params, func(p wire.PathParams) (any, error) { return s.mkdir(ctx, p) })
	case wire.MethodMove:
		return call(params, func(p wire.MoveParams) (any, error) { return s.move(ctx, p) })
	case wire.MethodRemove:
		return call(params, func(p wire.PathParams) (any, error) { return nil, s.remove(ctx, p) })
	case wire.MethodRead:
		return call(params, func(p wire.PathParams) (any, error) { return s.read(ctx, st, p) })
	case wire.MethodWrite:
		return call(params, func(p wire.WriteParams) (any, error) { return s.write(ctx, st, p) })
	case wire.MethodWatch:
		return call(params, func(p wire.WatchParams) (any, error) { return nil, s.watch(ctx, st, p) })
	case wire.MethodContextCreate:
		return call(params, func(p wire.ContextParams) (any, error) { return s.contextCreate(ctx, p) })
	case wire.MethodContexts:
		return call(params, func(p wire.ContextsParams) (any, error) { return s.listContexts(p) })
	case wire.MethodContextRestart:
		return call(params, func(p wire.ContextIDParams) (any, error) { return s.contextRestart(ctx, p) })
	case wire.MethodContextDelete:
		return call(params, func(p wire.ContextIDParams) (any, error) { return nil, s.contextDelete(p) })
	case wire.MethodExecute:
		return call(params, func(p wire.ExecuteParams) (any, error) { return s.execute(ctx, st, p) })
	case wire.MethodTunnel:
		return call(params, func(p wire.TunnelParams) (any, error) { return nil, s.tunnel(ctx, st, p) })
	}
	return nil, &api.Error{Code: api.CodeInvalidArgument, Message: "unknown method " + method}
}

// call decodes params into P and runs fn.
func call[P any](params json.RawMessage, fn func(P) (any, error)) (any, error) {
	var p P
	if len(params) > 0 {
		if err := json.Unmarshal(params, &p); err != nil {
			return nil, &api.Error{Code: api.CodeInvalidArgument, Message: "decoding params: " + err.Error()}
		}
	}
	return fn(p)
}
