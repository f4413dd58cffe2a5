package sudo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kiln-sh/kiln/internal/agent/process"
)

// Broker serves sudo on a unix socket.
type Broker struct {
	// Path is the socket's path (SocketPath in a sandbox); its directory
	// is made root's, 0755.
	Path string
	// PathDir goes first on commands' PATH (the sudo client's dir).
	PathDir string
	// Start forks and executes a command and reports its wait status to
	// onExit (process.Table.Spawn: the agent's reaper and guard see it).
	Start func(argv0 string, argv []string, attr *syscall.ProcAttr, onExit func(syscall.WaitStatus)) (int, error)
	// Lookup resolves a user name or numeric uid of the sandbox.
	Lookup func(name string) (process.User, error)
	// Allowed says whether a uid may use sudo; nil: DefaultAllowed.
	Allowed func(uid uint32) bool
	// RequestTimeout bounds the wait for a client's request (10 s).
	RequestTimeout time.Duration
	Log            *slog.Logger
}

// maxConns bounds the connections served at once; more are refused.
const maxConns = 64

// DefaultAllowed is the sandbox's sudo policy: root, and any uid while
// PolicyFile exists (Kiln writes it for `user` in every template that has
// sudo; removing it, as root, revokes sudo). The sandbox is the boundary:
// every uid in it runs what its API caller runs.
func DefaultAllowed(uid uint32) bool {
	if uid == 0 {
		return true
	}
	_, err := os.Stat(PolicyFile)
	return err == nil
}

// Serve listens on b.Path and serves clients until ctx is done.
func (b *Broker) Serve(ctx context.Context) error {
	if b.Log == nil {
		b.Log = slog.New(slog.DiscardHandler)
	}
	l, err := listen(b.Path)
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	defer l.Close()
	sem := make(chan struct{}, maxConns)
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			// EMFILE and the like: wait for descriptors to free up.
			b.Log.Warn("sudo: accepting a connection", "err", err)
			select {
			case <-time.After(100 * time.Millisecond):
			case <-ctx.Done():
				return nil
			}
			continue
		}
		select {
		case sem <- struct{}{}:
			go func() {
				defer func() { <-sem }()
				b.serveConn(ctx, c)
			}()
		default:
			_ = c.SetWriteDeadline(time.Now().Add(time.Second))
			_ = writeFrame(c, reply{Exit: 1, Error: "too many sudo commands at once"})
			c.Close()
		}
	}
}

// listen makes the socket's directory (root's, 0755, whatever was
// there) and the socket (0666: any uid may connect; the broker checks
// who did).
func listen(path string) (*net.UnixListener, error) {
	dir := filepath.Dir(path)
	if fi, err := os.Lstat(dir); err == nil && (!fi.IsDir() || fi.Sys().(*syscall.Stat_t).Uid != uint32(os.Geteuid())) {
		if err := os.RemoveAll(dir); err != nil {
			return nil, fmt.Errorf("sudo: replacing %s: %w", dir, err)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("sudo: creating %s: %w", dir, err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, fmt.Errorf("sudo: %w", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("sudo: removing a stale socket: %w", err)
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("sudo: %w", err)
	}
	if err := os.Chmod(path, 0o666); err != nil {
		l.Close()
		return nil, fmt.Errorf("sudo: %w", err)
	}
	return l, nil
}

// serveConn serves one client; a panic ends the connection, not the
// agent.
func (b *Broker) serveConn(ctx context.Context, c *net.UnixConn) {
	defer c.Close()
	defer func() {
		if r := recover(); r != nil {
			b.Log.Error("sudo: panic serving a client", "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
		}
	}()
	rep := b.serve(ctx, c)
	_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_ = writeFrame(c, rep)
}

// serve reads a client's request, runs it and returns the reply.
func (b *Broker) serve(ctx context.Context, c *net.UnixConn) reply {
	cred, err := peerCred(c)
	if err != nil {
		return failed("cannot tell who is asking: %v", err)
	}
	_ = c.SetDeadline(time.Now().Add(cmpDuration(b.RequestTimeout, 10*time.Second)))
	req, files, err := readRequest(c)
	defer closeFiles(files)
	if err != nil {
		b.Log.Debug("sudo: bad request", "uid", cred.Uid, "err", err)
		return failed("bad request: %v", err)
	}
	allowed := b.Allowed
	if allowed == nil {
		allowed = DefaultAllowed
	}
	caller, err := b.Lookup(strconv.FormatUint(uint64(cred.Uid), 10))
	if err != nil {
		caller = process.User{Name: strconv.FormatUint(uint64(cred.Uid), 10), UID: cred.Uid, GID: cred.Gid}
	}
	if !allowed(cred.Uid) {
		return failed("%s is not allowed to run sudo in this sandbox (its template has no %s)", caller.Name, PolicyFile)
	}
	inv, err := parseArgs(req.Args)
	if err != nil {
		return failed("%v", err)
	}
	if inv.noop && len(inv.cmd) == 0 && !inv.login && !inv.shell {
		return reply{}
	}
	cmd, err := b.resolve(inv, req, caller)
	if err != nil {
		return failed("%v", err)
	}
	b.Log.Debug("sudo", "uid", cred.Uid, "as", cmd.user.Name, "args", cmd.argv)
	return b.run(ctx, c, cmd, files)
}

// run starts cmd with the client's descriptors and waits for it, killing
// its process group if the client goes away.
func (b *Broker) run(ctx context.Context, c *net.UnixConn, cmd command, files []*os.File) reply {
	sys := &syscall.SysProcAttr{Setpgid: true}
	if os.Geteuid() == 0 {
		sys.Credential = &syscall.Credential{Uid: cmd.user.UID, Gid: cmd.user.GID, Groups: cmd.user.Groups}
	}
	fds := make([]uintptr, len(files))
	for i, f := range files {
		fds[i] = f.Fd()
	}
	attr := &syscall.ProcAttr{Dir: cmd.dir, Env: cmd.env, Files: fds, Sys: sys}
	exited := make(chan syscall.WaitStatus, 1)
	var mu sync.Mutex // guards ended, so no signal reaches a reused pid
	ended := false
	pid, err := b.Start(cmd.path, cmd.argv, attr, func(ws syscall.WaitStatus) {
		mu.Lock()
		ended = true
		mu.Unlock()
		exited <- ws
	})
	closeFiles(files)
	if err != nil || pid <= 0 {
		return failed("%s: %v", cmd.argv[0], err)
	}
	signal := func(sig syscall.Signal) {
		mu.Lock()
		defer mu.Unlock()
		if !ended {
			_ = unix.Kill(-pid, sig)
		}
	}
	_ = c.SetDeadline(time.Time{})
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		for {
			var m clientMsg
			if err := readFrame(c, nil, maxFrame, &m); err != nil {
				return
			}
			if sig := syscall.Signal(m.Signal); forwarded(sig) {
				signal(sig)
			}
		}
	}()
	select {
	case ws := <-exited:
		return reply{Exit: exitCode(ws)}
	case <-gone:
		b.Log.Debug("sudo: client went away; killing its command", "pid", pid)
	case <-ctx.Done():
	}
	signal(syscall.SIGKILL)
	return failed("killed")
}

// exitCode is a wait status as a shell reports it.
func exitCode(ws syscall.WaitStatus) int {
	switch {
	case ws.Exited():
		return ws.ExitStatus()
	case ws.Signaled():
		return 128 + int(ws.Signal())
	}
	return 1
}

func failed(format string, args ...any) reply {
	return reply{Exit: 1, Error: fmt.Sprintf(format, args...)}
}

func cmpDuration(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// peerCred is who is on the other end of c.
func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	return cred, cerr
}

// readRequest reads the request and the three descriptors sent with its
// first byte; anything else (more or fewer descriptors, other control
// messages, an oversized or malformed request) is refused, and every
// descriptor received closed.
func readRequest(c *net.UnixConn) (request, []*os.File, error) {
	var req request
	head := make([]byte, 4)
	oob := make([]byte, unix.CmsgSpace(3*4))
	n, oobn, flags, _, err := c.ReadMsgUnix(head, oob)
	files := rights(oob[:oobn])
	switch {
	case err != nil:
		return req, files, err
	case n == 0:
		return req, files, errors.New("no request")
	case flags&unix.MSG_CTRUNC != 0 || len(files) != 3:
		return req, files, fmt.Errorf("want stdin, stdout and stderr with the request, got %d descriptors", len(files))
	}
	if err := readFrame(c, head[:n], maxRequest, &req); err != nil {
		return req, files, err
	}
	return req, files, nil
}

// rights returns the descriptors in control messages (as files, to be
// closed).
func rights(oob []byte) []*os.File {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var files []*os.File
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			files = append(files, os.NewFile(uintptr(fd), "sudo-client-fd"))
		}
	}
	return files
}

func closeFiles(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}
