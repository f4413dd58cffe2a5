package process

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kiln-sh/kiln/api"
)

// Start starts a process and returns it with a subscription that has seen
// nothing yet, so the caller can follow every event from the start event
// on. The caller must Close the subscription (that detaches; the process
// runs on).
func (t *Table) Start(s Spec) (*Process, *Subscription, error) {
	select {
	case <-t.stop:
		return nil, nil, apiErrorf(api.CodeUnavailable, "the agent is shutting down")
	default:
	}
	if len(s.Args) == 0 || s.Args[0] == "" {
		return nil, nil, apiErrorf(api.CodeInvalidArgument, "no command given")
	}
	env := buildEnv(*t.baseEnv.Load(), s.User, s.PTY != nil, s.Env, t.opts.PathDir)
	argv0, ok := LookPath(s.Args[0], getenv(env, "PATH"))
	if !ok {
		return nil, nil, apiErrorf(api.CodeNotFound, "executable %q not found", s.Args[0])
	}
	dir, err := workDir(s.Dir, s.User.Home)
	if err != nil {
		return nil, nil, err
	}
	outLimit := s.OutputLimit
	if outLimit <= 0 {
		outLimit = t.opts.OutputLimit
	}

	p := &Process{
		table:    t,
		log:      newEventLog(t.opts.ReplayBytes, outLimit, t.replay),
		outLimit: outLimit,
		timeout:  s.Timeout,
		exited:   make(chan struct{}),
		done:     make(chan struct{}),
		info: api.ProcessInfo{Tag: s.Tag, Args: s.Args, Cwd: dir, User: s.User.Name,
			PTY: s.PTY != nil, Env: s.Env},
	}
	sub := p.log.subscribe(0)
	pio, err := p.openIO(s)
	if err != nil {
		return nil, nil, err
	}
	sys := &syscall.SysProcAttr{Setpgid: s.PTY == nil, Setsid: s.PTY != nil, Setctty: s.PTY != nil, Ctty: 0}
	if os.Geteuid() == 0 {
		sys.Credential = &syscall.Credential{Uid: s.User.UID, Gid: s.User.GID, Groups: s.User.Groups}
	}
	attr := &syscall.ProcAttr{Dir: dir, Env: env, Files: pio.childFds, Sys: sys}
	p.oomBase, p.oomKnown = t.opts.OOMKills()
	p.info.StartedAt = time.Now()
	_, err = t.reaper.start(func() (int, error) {
		pid, err := syscall.ForkExec(argv0, s.Args, attr)
		p.pid = pid
		return pid, err
	}, p.onExit)
	pio.closeChild()
	if err != nil {
		pio.closeParent()
		return nil, nil, startError(err, s.Args[0], dir)
	}
	p.info.PID = p.pid
	p.log.appendEvent(api.Event{Type: api.EventStart, PID: p.pid, Time: p.info.StartedAt})
	t.add(p)
	if s.Timeout > 0 {
		p.timer = time.AfterFunc(s.Timeout, func() {
			p.kill(exitCause{reason: api.ExitTimeout, message: fmt.Sprintf("killed after its timeout of %s", s.Timeout)})
		})
	}
	var wg sync.WaitGroup
	for _, r := range pio.readers {
		wg.Go(func() { p.readLoop(r.f, r.typ) })
	}
	go p.wait(&wg, pio)
	t.log.Debug("process started", "pid", p.pid, "args", s.Args, "user", s.User.Name, "pty", s.PTY != nil)
	return p, sub, nil
}

// workDir resolves the working directory: relative to home, default home,
// and "/" if the default home does not exist.
func workDir(dir, home string) (string, error) {
	if strings.ContainsRune(dir, 0) {
		return "", apiErrorf(api.CodeInvalidArgument, "working directory contains a NUL byte")
	}
	if dir == "" {
		if fi, err := os.Stat(home); err != nil || !fi.IsDir() {
			return "/", nil
		}
		return home, nil
	}
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(home, dir)
	}
	dir = filepath.Clean(dir)
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return "", apiErrorf(api.CodeNotFound, "working directory %s does not exist", dir)
	case err != nil:
		return "", apiErrorf(api.CodeInvalidArgument, "working directory %s: %v", dir, errors.Unwrap(err))
	case !fi.IsDir():
		return "", apiErrorf(api.CodeInvalidArgument, "working directory %s is not a directory", dir)
	}
	return dir, nil
}

// startError classifies a fork/exec failure.
func startError(err error, name, dir string) error {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return fmt.Errorf("starting %s: %w", name, err)
	}
	switch errno {
	case unix.EACCES, unix.EPERM:
		return apiErrorf(api.CodePermissionDenied, "starting %s in %s: %v", name, dir, errno)
	case unix.ENOENT, unix.ENOTDIR:
		return apiErrorf(api.CodeNotFound, "starting %s in %s: %v", name, dir, errno)
	case unix.EINVAL:
		return apiErrorf(api.CodeInvalidArgument, "starting %s: invalid argument or environment (NUL byte?)", name)
	case unix.ENOEXEC:
		return apiErrorf(api.CodeInvalidArgument, "starting %s: not an executable format", name)
	case unix.E2BIG, unix.ENAMETOOLONG:
		// The kernel's limits: 128 KiB per argument or variable, and the
		// stack's share for all of them.
		return apiErrorf(api.CodeInvalidArgument, "starting %s: an argument or the environment is too long for the kernel (%v); "+
			"write the script to a file and run that", name, errno)
	case unix.EAGAIN, unix.ENOMEM, unix.EMFILE, unix.ENFILE:
		return apiErrorf(api.CodeResourceExhausted, "starting %s: %v", name, errno)
	}
	return fmt.Errorf("starting %s: %w", name, err)
}

// reader is one output source of a process.
type reader struct {
	f   *os.File
	typ api.EventType
}

// procIO holds a process's descriptors while it starts.
type procIO struct {
	childFds []uintptr
	child    []*os.File // closed once the child has them
	readers  []reader   // parent ends of stdout/stderr, or the PTY master
	stdin    *os.File   // parent end of stdin, or the PTY master
	pty      *os.File
}

// openIO creates the pipes (or terminal) of a process. Parent ends are
// non-blocking, so reads and writes honour deadlines; calling Fd on child
// ends puts them back into blocking mode for the child.
func (p *Process) openIO(s Spec) (*procIO, error) {
	io := &procIO{}
	if s.PTY != nil {
		master, slave, err := openPTY(s.PTY.Cols, s.PTY.Rows)
		if err != nil {
			return nil, apiErrorf(api.CodeUnavailable, "%v", err)
		}
		io.pty, io.stdin = master, master
		io.readers = []reader{{master, api.EventStdout}}
		io.child = []*os.File{slave}
		fd := slave.Fd()
		io.childFds = []uintptr{fd, fd, fd}
		p.pty, p.stdin = master, master
		return io, nil
	}
	fail := func(err error) (*procIO, error) {
		io.closeChild()
		io.closeParent()
		return nil, apiErrorf(api.CodeResourceExhausted, "creating pipes: %v", err)
	}
	var stdin *os.File
	if s.Stdin {
		r, w, err := os.Pipe()
		if err != nil {
			return fail(err)
		}
		stdin, io.stdin, p.stdin = r, w, w
	} else {
		f, err := os.Open(os.DevNull)
		if err != nil {
			return fail(err)
		}
		stdin = f
	}
	io.child = append(io.child, stdin)
	fds := []uintptr{stdin.Fd()}
	for _, typ := range []api.EventType{api.EventStdout, api.EventStderr} {
		r, w, err := os.Pipe()
		if err != nil {
			return fail(err)
		}
		io.child = append(io.child, w)
		io.readers = append(io.readers, reader{r, typ})
		fds = append(fds, w.Fd())
	}
	io.childFds = fds
	return io, nil
}

func (io *procIO) closeChild() {
	for _, f := range io.child {
		f.Close()
	}
	io.child = nil
}

func (io *procIO) closeParent() {
	for _, r := range io.readers {
		r.f.Close()
	}
	if io.stdin != nil && io.stdin != io.pty {
		io.stdin.Close()
	}
}
