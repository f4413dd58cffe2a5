// Package jupyter runs Jupyter kernels (ipykernel, IRkernel) and speaks
// the Jupyter messaging protocol 5.3 to them over ZMQ (go-zeromq/zmq4,
// pure Go): shell and control as DEALER sockets, iopub as SUB, every
// message signed and verified with HMAC-SHA256. The heartbeat channel is
// not used: the kernel is the agent's child, so its death is seen
// directly.
//
// It runs inside the sandbox.
package jupyter

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kiln-sh/kiln/internal/agent/kernel"
)

// Timeouts of a kernel's lifecycle.
const (
	// startTimeout bounds a kernel's start: ~1 s (Python) to ~9 s (R)
	// under gVisor on a quiet host, and ten times that on a host busy
	// enough (a CI run beside fork bombs took over 60 s for R).
	startTimeout = 3 * time.Minute
	// interruptGrace is how long an interrupted execution may take to
	// stop before the kernel is restarted; SIGINT is resent every second.
	interruptGrace = 5 * time.Second
	killTimeout    = 5 * time.Second
)

// Spec says how to launch one kind of kernel.
type Spec struct {
	Language string
	// Argv is the kernel's command line given its connection file.
	Argv func(connFile string) []string
	// Env is added to the kernel's environment.
	Env []string
	// SetEnv returns code that sets env for one execution and code that
	// restores the previous values; both run as silent executions around
	// the caller's code. Nil: per-execution env is rejected.
	SetEnv func(env map[string]string) (set, restore string)
	// Files are written into the kernel's directory (next to its
	// connection file, readable by it) before it starts: e.g. a startup
	// script its Argv names.
	Files map[string]string
}

// Kernel is a running Jupyter kernel; it implements kernel.Kernel.
type Kernel struct {
	spec  Spec
	opts  kernel.Options
	spawn kernel.Spawner

	exec sync.Mutex // one execution at a time

	mu     sync.Mutex
	cur    *instance // nil once closed
	closed bool
}

var (
	_ kernel.Kernel = (*Kernel)(nil)
	_ kernel.PIDer  = (*Kernel)(nil)
)

// New returns a Factory for spec.
func New(spec Spec) kernel.Factory {
	return func(ctx context.Context, o kernel.Options) (kernel.Kernel, error) {
		return Start(ctx, spec, o)
	}
}

// Start launches a kernel and waits until it answers.
func Start(ctx context.Context, spec Spec, o kernel.Options) (*Kernel, error) {
	registerTransport()
	k := &Kernel{spec: spec, opts: o, spawn: kernel.SpawnerFrom(ctx)}
	in, err := k.launch(ctx)
	if err != nil {
		return nil, err
	}
	k.cur = in
	return k, nil
}

// Language returns the kernel's language.
func (k *Kernel) Language() string { return k.spec.Language }

// PID returns the kernel process's pid, 0 while there is none (it
// implements kernel.PIDer).
func (k *Kernel) PID() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.cur == nil || k.cur.proc == nil {
		return 0
	}
	return k.cur.proc.PID()
}

// Interrupt sends SIGINT to the kernel's process group (interrupt_mode
// signal).
func (k *Kernel) Interrupt(ctx context.Context) error {
	in, err := k.instance()
	if err != nil {
		return err
	}
	return in.proc.Signal(syscall.SIGINT)
}

// Restart kills the interpreter and starts a fresh one.
func (k *Kernel) Restart(ctx context.Context) error {
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		return errClosed
	}
	old := k.cur
	k.cur = nil
	k.mu.Unlock()
	if old != nil {
		old.stop()
	}
	in, err := k.launch(ctx)
	k.mu.Lock()
	defer k.mu.Unlock()
	if err != nil {
		return err
	}
	if k.closed {
		in.stop()
		return errClosed
	}
	k.cur = in
	return nil
}

// Close stops the kernel.
func (k *Kernel) Close() error {
	k.mu.Lock()
	in := k.cur
	k.cur, k.closed = nil, true
	k.mu.Unlock()
	if in != nil {
		in.stop()
	}
	return nil
}

// discardLog silences zmq4's own logging.
var discardLog = log.New(io.Discard, "", 0)

var errClosed = errors.New("the kernel is closed")

// instance returns the running instance, restarting a dead one.
func (k *Kernel) instance() (*instance, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return nil, errClosed
	}
	if k.cur == nil {
		return nil, errors.New("the kernel is restarting")
	}
	return k.cur, nil
}

// liveInstance returns the running instance, first relaunching it if it
// died.
func (k *Kernel) liveInstance(ctx context.Context) (*instance, error) {
	in, err := k.instance()
	if err == nil && in.alive() {
		return in, nil
	}
	if errors.Is(err, errClosed) {
		return nil, err
	}
	if err := k.Restart(ctx); err != nil {
		return nil, err
	}
	return k.instance()
}

// instance is one run of the kernel process with its sockets.
type instance struct {
	language string
	proc     *kernel.Proc
	dir      string
	session  string
	sign     signer
	cancel   context.CancelFunc
	shell    zmq4.Socket
	control  zmq4.Socket
	iopub    zmq4.Socket
	msgs     chan message // from shell and iopub
	stopped  chan struct{}
	stopOnce sync.Once
}

// launch starts the kernel process, connects and waits for its
// kernel_info_reply. On failure it stops what it started: the instance is
// a local, not a named result, which every failing return sets to nil
// (stopping a nil instance was a panic that took the agent, PID 1, and so
// the sandbox with it).
func (k *Kernel) launch(ctx context.Context) (_ *instance, err error) {
	info, err := newConnInfo()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "kiln-kernel-")
	if err != nil {
		return nil, fmt.Errorf("creating kernel directory: %w", err)
	}
	sctx, cancel := context.WithCancel(context.Background())
	in := &instance{language: k.spec.Language, dir: dir, session: newID(), sign: signer{key: []byte(info.Key)},
		cancel: cancel, msgs: make(chan message, 64), stopped: make(chan struct{})}
	defer func() {
		if err != nil {
			in.stop()
		}
	}()
	if os.Geteuid() == 0 {
		if err := os.Chown(dir, int(k.opts.UID), int(k.opts.GID)); err != nil {
			return nil, fmt.Errorf("handing the kernel directory to uid %d: %w", k.opts.UID, err)
		}
	}
	file, err := info.write(dir, k.opts.UID, k.opts.GID)
	if err != nil {
		return nil, err
	}
	for name, content := range k.spec.Files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return nil, fmt.Errorf("writing the kernel's %s: %w", name, err)
		}
	}
	env := append(append([]string(nil), k.opts.Env...), k.spec.Env...)
	in.proc, err = kernel.StartProc(kernel.WithSpawner(ctx, k.spawn), kernel.Cmd{
		Args: k.spec.Argv(file), Dir: k.opts.Cwd, Env: env, UID: k.opts.UID, GID: k.opts.GID,
	})
	if err != nil {
		return nil, fmt.Errorf("starting the %s kernel: %w", k.spec.Language, err)
	}
	// Stop dialling if the process dies before it is ready, or ctx ends.
	ready := make(chan struct{})
	defer close(ready)
	go func() {
		select {
		case <-in.proc.Done():
			cancel()
		case <-ready:
		}
	}()
	ctx, cancelStart := context.WithTimeout(ctx, startTimeout)
	defer cancelStart()
	stopAfter := context.AfterFunc(ctx, cancel)
	defer stopAfter()

	opts := []zmq4.Option{zmq4.WithDialerRetry(20 * time.Millisecond), zmq4.WithDialerMaxRetries(-1),
		zmq4.WithID(zmq4.SocketIdentity(in.session)), zmq4.WithLogger(discardLog)}
	in.shell = zmq4.NewDealer(sctx, opts...)
	in.control = zmq4.NewDealer(sctx, opts...)
	in.iopub = zmq4.NewSub(sctx, opts...)
	if err := in.iopub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		return nil, fmt.Errorf("subscribing to iopub: %w", err)
	}
	for _, d := range []struct {
		s    zmq4.Socket
		port int
	}{{in.shell, info.ShellPort}, {in.control, info.ControlPort}, {in.iopub, info.IOPubPort}} {
		if err := d.s.Dial(info.endpoint(d.port)); err != nil {
			return nil, in.startError(ctx, fmt.Errorf("connecting to the kernel: %w", err))
		}
	}
	go in.receive(in.shell)
	go in.receive(in.iopub)
	if err := in.waitReady(ctx); err != nil {
		return nil, in.startError(ctx, err)
	}
	return in, nil
}

// startError explains why a kernel did not come up: its exit status and
// what it printed, when it died.
func (in *instance) startError(ctx context.Context, err error) error {
	select {
	case <-in.proc.Done():
	case <-time.After(100 * time.Millisecond):
	}
	if exit := in.proc.Exit(); exit != "" {
		return fmt.Errorf("starting the %s kernel: it ended with %s: %s", in.language, exit, strings.TrimSpace(in.proc.Tail()))
	}
	if ctx.Err() != nil {
		return fmt.Errorf("starting the %s kernel: no answer within %s: %w", in.language, startTimeout, ctx.Err())
	}
	return fmt.Errorf("starting the %s kernel: %w", in.language, err)
}

// waitReady sends kernel_info_request until a reply arrives and iopub
// has delivered a message too (so our subscription is in place).
func (in *instance) waitReady(ctx context.Context) error {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	replied, published := false, false
	for {
		// Each request also makes the kernel publish busy and idle.
		if _, err := in.send(in.shell, "kernel_info_request", struct{}{}); err != nil {
			return err
		}
	wait:
		for {
			select {
			case m := <-in.msgs:
				switch m.Header.MsgType {
				case "kernel_info_reply":
					replied = true
				case "status":
					published = true
				}
				if replied && published {
					return nil
				}
			case <-tick.C:
				break wait
			case <-in.proc.Done():
				return errors.New("the kernel exited")
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
}

// send signs and sends a message; it returns the message id.
func (in *instance) send(s zmq4.Socket, msgType string, content any) (string, error) {
	id, frames, err := in.sign.encode(in.session, msgType, content)
	if err != nil {
		return "", err
	}
	if err := s.SendMulti(zmq4.NewMsgFrom(frames...)); err != nil {
		return "", fmt.Errorf("sending %s: %w", msgType, err)
	}
	return id, nil
}

// receive decodes a socket's messages into msgs until the socket fails.
// Messages that do not verify are dropped.
func (in *instance) receive(s zmq4.Socket) {
	for {
		raw, err := s.Recv()
		if err != nil {
			return
		}
		m, err := in.sign.decode(raw.Frames)
		if err != nil {
			continue
		}
		select {
		case in.msgs <- m:
		case <-in.stopped:
			return
		}
	}
}

func (in *instance) alive() bool {
	select {
	case <-in.proc.Done():
		return false
	default:
		return true
	}
}

// stop kills the kernel process, closes the sockets and removes the
// connection file.
func (in *instance) stop() {
	in.stopOnce.Do(func() {
		close(in.stopped)
		if in.proc != nil {
			ctx, cancel := context.WithTimeout(context.Background(), killTimeout)
			_ = in.proc.Kill(ctx)
			cancel()
		}
		in.cancel()
		for _, s := range []zmq4.Socket{in.shell, in.control, in.iopub} {
			if s != nil {
				_ = s.Close()
			}
		}
		_ = os.RemoveAll(in.dir)
	})
}
