package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/channel"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/rootfs"
)

// Agent is the host's typed client of one sandbox's kiln-agent. What the
// agent sends is untrusted: frames are size-limited by the channel, and
// decoding errors end the call.
type Agent struct {
	conn *channel.Conn
	// layer is the sandbox's writable layer (rootfs.Mount's dir), synced
	// after an upload so that an acknowledged upload is on the host's
	// disk; "" skips that.
	layer string
}

// Ping round-trips an empty call.
func (a *Agent) Ping(ctx context.Context) error {
	var p wire.Pong
	return a.invoke(ctx, wire.MethodPing, struct{}{}, &p)
}

// Identify tells a restored agent which sandbox it serves now: its id and
// environment (see wire.MethodIdentify).
func (a *Agent) Identify(ctx context.Context, p wire.IdentifyParams) error {
	return a.invoke(ctx, wire.MethodIdentify, p, nil)
}

// Exec starts a process and streams its events to emit until it exits,
// ctx is done (the process is detached, not killed) or emit fails.
func (a *Agent) Exec(ctx context.Context, p wire.ExecParams, emit func(api.Event) error) (*api.ExitStatus, error) {
	return a.follow(ctx, wire.MethodExec, p, emit)
}

// Attach re-attaches to a process, replaying its buffered events after
// p.AfterSeq, then following it as Exec does.
func (a *Agent) Attach(ctx context.Context, p wire.AttachParams, emit func(api.Event) error) (*api.ExitStatus, error) {
	return a.follow(ctx, wire.MethodAttach, p, emit)
}

func (a *Agent) follow(ctx context.Context, method string, params any, emit func(api.Event) error) (*api.ExitStatus, error) {
	st, err := a.conn.Call(ctx, method, params)
	if err != nil {
		return nil, agentError(err)
	}
	defer st.Close()
	var exit *api.ExitStatus
	for {
		f, err := st.Recv(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, agentError(err)
		}
		var ev api.Event
		if err := json.Unmarshal(f.Payload, &ev); err != nil {
			return nil, fmt.Errorf("decoding agent event: %w", err)
		}
		if ev.Type == api.EventExit && ev.Exit != nil {
			exit = ev.Exit
		}
		if err := emit(ev); err != nil {
			return nil, err
		}
	}
	if exit == nil {
		var res api.ExitStatus
		if err := st.Wait(ctx, &res); err != nil {
			return nil, agentError(err)
		}
		exit = &res
	}
	return exit, nil
}

// Stdin writes to a process's stdin, or closes it.
func (a *Agent) Stdin(ctx context.Context, p wire.StdinParams) error {
	return a.invoke(ctx, wire.MethodStdin, p, nil)
}

// Signal signals a process and its group.
func (a *Agent) Signal(ctx context.Context, p wire.SignalParams) error {
	return a.invoke(ctx, wire.MethodSignal, p, nil)
}

// Resize resizes a process's terminal.
func (a *Agent) Resize(ctx context.Context, p wire.ResizeParams) error {
	return a.invoke(ctx, wire.MethodResize, p, nil)
}

// Processes lists the processes started through the agent.
func (a *Agent) Processes(ctx context.Context) ([]api.ProcessInfo, error) {
	var ps []api.ProcessInfo
	return ps, a.invoke(ctx, wire.MethodProcesses, struct{}{}, &ps)
}

// Stat describes a path.
func (a *Agent) Stat(ctx context.Context, p wire.PathParams) (api.FileInfo, error) {
	var fi api.FileInfo
	return fi, a.invoke(ctx, wire.MethodStat, p, &fi)
}

// maxListEntries bounds a listing the host accepts (the agent stops at
// 20,000 entries).
const maxListEntries = 50000

// List lists a directory; the agent sends the entries in batches.
func (a *Agent) List(ctx context.Context, p wire.ListParams) ([]api.FileInfo, error) {
	fis := []api.FileInfo{}
	var res []api.FileInfo // what an agent from before batching answers
	err := a.frames(ctx, wire.MethodList, p, channel.FrameEvent, func(b []byte) error {
		var batch []api.FileInfo
		if err := json.Unmarshal(b, &batch); err != nil {
			return fmt.Errorf("decoding agent listing: %w", err)
		}
		if len(fis)+len(batch) > maxListEntries {
			return fmt.Errorf("agent listing of more than %d entries: %w", maxListEntries, errdefs.ErrResourceExhausted)
		}
		fis = append(fis, batch...)
		return nil
	}, &res)
	if len(res) > 0 {
		return res, err
	}
	return fis, err
}

// frames makes a call, passes the payload of every frame of type typ to
// fn, and then decodes the call's result into result.
func (a *Agent) frames(ctx context.Context, method string, params any, typ channel.FrameType, fn func([]byte) error, result any) error {
	st, err := a.conn.Call(ctx, method, params)
	if err != nil {
		return agentError(err)
	}
	defer st.Close()
	for {
		f, err := st.Recv(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return agentError(err)
		}
		if f.Type != typ {
			continue
		}
		if err := fn(f.Payload); err != nil {
			return err
		}
	}
	return agentError(st.Wait(ctx, result))
}

// Mkdir creates a directory and its parents.
func (a *Agent) Mkdir(ctx context.Context, p wire.PathParams) (api.FileInfo, error) {
	var fi api.FileInfo
	return fi, a.invoke(ctx, wire.MethodMkdir, p, &fi)
}

// Move renames a path.
func (a *Agent) Move(ctx context.Context, p wire.MoveParams) (api.FileInfo, error) {
	var fi api.FileInfo
	return fi, a.invoke(ctx, wire.MethodMove, p, &fi)
}

// Remove removes a path, recursively.
func (a *Agent) Remove(ctx context.Context, p wire.PathParams) error {
	return a.invoke(ctx, wire.MethodRemove, p, nil)
}

// ReadFile streams a file's contents to w.
func (a *Agent) ReadFile(ctx context.Context, p wire.PathParams, w io.Writer) (api.FileInfo, error) {
	var fi api.FileInfo
	err := a.frames(ctx, wire.MethodRead, p, channel.FrameData, func(b []byte) error {
		if _, err := w.Write(b); err != nil {
			return fmt.Errorf("writing file contents: %w", err)
		}
		return nil
	}, &fi)
	return fi, err
}

// WriteFile streams r into a file, creating its parents.
func (a *Agent) WriteFile(ctx context.Context, p wire.WriteParams, r io.Reader) (api.FileInfo, error) {
	var fi api.FileInfo
	if a.layer != "" {
		// Watch the layer from before the upload: a full or failing host
		// disk under it surfaces here, not in the sandbox's fsync.
		sync, err := rootfs.NewSyncer(a.layer)
		if err != nil {
			return fi, err
		}
		defer sync.Close()
		fi, err := a.writeFile(ctx, p, r)
		if err == nil {
			if serr := sync.Sync(); serr != nil {
				err = fmt.Errorf("disk full: the host could not store the upload: %v: %w", serr, errdefs.ErrResourceExhausted)
			}
		}
		return fi, err
	}
	return a.writeFile(ctx, p, r)
}

func (a *Agent) writeFile(ctx context.Context, p wire.WriteParams, r io.Reader) (api.FileInfo, error) {
	var fi api.FileInfo
	st, err := a.conn.Call(ctx, wire.MethodWrite, p)
	if err != nil {
		return fi, agentError(err)
	}
	defer st.Close()
	buf := make([]byte, channel.MaxPayload)
	for {
		n, rerr := r.Read(buf)
		if n > 0 {
			if err := st.SendData(ctx, buf[:n]); err != nil {
				// The agent may have ended the call early (e.g. disk
				// full): prefer its error.
				if werr := st.Wait(ctx, &fi); werr != nil {
					return fi, agentError(werr)
				}
				return fi, agentError(err)
			}
		}
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			return fi, fmt.Errorf("reading upload: %w", rerr)
		}
	}
	if err := st.CloseSend(); err != nil {
		return fi, agentError(err)
	}
	return fi, agentError(st.Wait(ctx, &fi))
}

// Watch streams file events under a directory until ctx is done or emit
// fails.
func (a *Agent) Watch(ctx context.Context, p wire.WatchParams, emit func(api.Event) error) error {
	_, err := a.follow(ctx, wire.MethodWatch, p, emit)
	return err
}

func (a *Agent) invoke(ctx context.Context, method string, params, result any) error {
	return agentError(a.conn.Invoke(ctx, method, params, result))
}

// agentError classifies an agent's error into errdefs, keeping its
// message for the client.
func agentError(err error) error {
	if err == nil {
		return nil
	}
	var ae *api.Error
	if errors.As(err, &ae) {
		return fmt.Errorf("%s: %w", ae.Message, codeClass(ae.Code))
	}
	if errors.Is(err, channel.ErrSessionClosed) {
		return fmt.Errorf("sandbox agent: %w: %w", errdefs.ErrUnavailable, err)
	}
	return err
}

// codeClass is the class of an agent's error code. An agent does not
// speak for the caller's credentials: unauthenticated, like internal and
// codes it should not send, is an agent internal error.
func codeClass(c api.ErrorCode) error {
	if class := errdefs.Class(c); class != nil && c != api.CodeUnauthenticated {
		return class
	}
	return errors.New("agent internal error")
}
