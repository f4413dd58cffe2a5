package kernel

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// ErrDied marks an execution that ended because the interpreter process
// exited. The kernel's state is lost; the next execution starts a fresh
// interpreter.
var ErrDied = errors.New("the interpreter exited")

// Spawner forks and executes a kernel's interpreter and delivers its wait
// status to onExit. The agent passes its process table's (package process,
// Table.Spawn), so that its reaper routes the status instead of reaping it
// as an orphan's.
type Spawner func(argv0 string, argv []string, attr *syscall.ProcAttr, onExit func(syscall.WaitStatus)) (pid int, err error)

type spawnerKey struct{}

// WithSpawner returns a context that makes StartProc use s. Factories
// receive it in their ctx (the Factory signature has no room for it); a
// kernel keeps the Spawner it was created with for its restarts.
func WithSpawner(ctx context.Context, s Spawner) context.Context {
	return context.WithValue(ctx, spawnerKey{}, s)
}

// SpawnerFrom returns the Spawner carried by ctx, or one that waits for
// the child itself with wait4(pid) (right when nothing reaps with
// wait4(-1)).
func SpawnerFrom(ctx context.Context) Spawner {
	if s, ok := ctx.Value(spawnerKey{}).(Spawner); ok && s != nil {
		return s
	}
	return spawnOwn
}

func spawnOwn(argv0 string, argv []string, attr *syscall.ProcAttr, onExit func(syscall.WaitStatus)) (int, error) {
	pid, err := syscall.ForkExec(argv0, argv, attr)
	if err != nil {
		return 0, err
	}
	go func() {
		var ws syscall.WaitStatus
		for {
			_, err := syscall.Wait4(pid, &ws, 0, nil)
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			if err != nil {
				ws = syscall.WaitStatus(0xff << 8) // reaped by someone else
			}
			onExit(ws)
			return
		}
	}()
	return pid, nil
}

// Cmd describes an interpreter process.
type Cmd struct {
	Args  []string // Args[0] is looked up in Env's PATH
	Dir   string
	Env   []string
	UID   uint32
	GID   uint32
	Stdin *os.File // nil: /dev/null
	// Stdout receives the process's stdout and stderr; nil: they are kept
	// only as a bounded tail for error messages (Proc.Tail).
	Stdout *os.File
}

// tailBytes bounds what a Proc keeps of its output for error messages.
const tailBytes = 4 << 10

// Proc is a running interpreter in its own process group.
type Proc struct {
	pid  int
	done chan struct{}

	mu     sync.Mutex
	status syscall.WaitStatus
	tail   []byte
}

// StartProc starts c in a new process group as c.UID/c.GID (when the agent
// runs as root), using the Spawner in ctx.
func StartProc(ctx context.Context, c Cmd) (*Proc, error) {
	if len(c.Args) == 0 {
		return nil, errors.New("starting interpreter: no command")
	}
	argv0, err := LookPath(c.Args[0], Getenv(c.Env, "PATH"))
	if err != nil {
		return nil, err
	}
	p := &Proc{done: make(chan struct{})}
	stdin := c.Stdin
	if stdin == nil {
		f, err := os.Open(os.DevNull)
		if err != nil {
			return nil, fmt.Errorf("opening %s: %w", os.DevNull, err)
		}
		defer f.Close()
		stdin = f
	}
	out, tailR := c.Stdout, (*os.File)(nil)
	if out == nil {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, fmt.Errorf("creating output pipe: %w", err)
		}
		defer w.Close()
		out, tailR = w, r
	}
	sys := &syscall.SysProcAttr{Setpgid: true}
	if os.Geteuid() == 0 {
		sys.Credential = &syscall.Credential{Uid: c.UID, Gid: c.GID, Groups: []uint32{}}
	}
	attr := &syscall.ProcAttr{Dir: c.Dir, Env: c.Env, Files: []uintptr{stdin.Fd(), out.Fd(), out.Fd()}, Sys: sys}
	pid, err := SpawnerFrom(ctx)(argv0, c.Args, attr, p.exited)
	if err != nil {
		if tailR != nil {
			tailR.Close()
		}
		return nil, fmt.Errorf("starting %s: %w", c.Args[0], err)
	}
	p.pid = pid
	if tailR != nil {
		go p.keepTail(tailR)
	}
	return p, nil
}

func (p *Proc) exited(ws syscall.WaitStatus) {
	p.mu.Lock()
	p.status = ws
	p.mu.Unlock()
	close(p.done)
}

func (p *Proc) keepTail(r *os.File) {
	defer r.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			p.mu.Lock()
			p.tail = append(p.tail, buf[:n]...)
			if len(p.tail) > tailBytes {
				p.tail = append(p.tail[:0], p.tail[len(p.tail)-tailBytes:]...)
			}
			p.mu.Unlock()
		}
		if err != nil {
			return
		}
	}
}

// PID returns the process id (and process group id).
func (p *Proc) PID() int { return p.pid }

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Signal sends sig to the process group.
func (p *Proc) Signal(sig syscall.Signal) error {
	select {
	case <-p.done:
		return nil
	default:
	}
	if err := unix.Kill(-p.pid, sig); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("signalling interpreter: %w", err)
	}
	return nil
}

// Kill kills the process group and waits for the process to exit or ctx
// to be done.
func (p *Proc) Kill(ctx context.Context) error {
	_ = p.Signal(syscall.SIGKILL)
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for the interpreter to exit: %w", ctx.Err())
	}
}

// Exit describes how the process ended ("" while it runs), e.g. "exit
// code 1" or "killed by signal SIGKILL".
func (p *Proc) Exit() string {
	select {
	case <-p.done:
	default:
		return ""
	}
	p.mu.Lock()
	ws := p.status
	p.mu.Unlock()
	if ws.Signaled() {
		return "killed by signal " + unix.SignalName(ws.Signal())
	}
	return fmt.Sprintf("exit code %d", ws.ExitStatus())
}

// Tail returns the last few KiB the process wrote to its own stdout and
// stderr (not what executed code printed, which kernels capture).
func (p *Proc) Tail() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.ToValidUTF8(string(p.tail), "\uFFFD")
}

// Getenv looks key up in an environment list; the last entry wins.
func Getenv(env []string, key string) string {
	v := ""
	for _, kv := range env {
		if k, val, ok := strings.Cut(kv, "="); ok && k == key {
			v = val
		}
	}
	return v
}

// LookPath finds an executable in path (a PATH value), as a shell would
// for the child.
func LookPath(file, path string) (string, error) {
	if strings.Contains(file, "/") {
		if isExecutable(file) {
			return file, nil
		}
		return "", fmt.Errorf("finding %s: %w", file, os.ErrNotExist)
	}
	if path == "" {
		path = "/usr/local/bin:/usr/bin:/bin"
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		if p := filepath.Join(dir, file); isExecutable(p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("finding %s in PATH: %w", file, os.ErrNotExist)
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}
