// Package files implements the agent's file operations inside a sandbox:
// stat, list, mkdir, move, remove, streamed read and write, and watch.
//
// Permissions: every operation for a non-root user runs its file system
// calls on a dedicated OS thread whose effective uid, gid and
// supplementary groups are switched to that user (per-thread setresuid,
// setresgid and setgroups, which Linux and gVisor keep per thread). The
// kernel then checks permissions exactly as for the user, and whatever is
// created is owned by the user. The thread is never unlocked, so the Go
// runtime destroys it, with its credentials, when the operation ends.
// Descriptors opened there are used afterwards from ordinary goroutines:
// permission is checked at open.
//
// Paths: relative paths resolve against the user's home; paths are
// cleaned; empty paths and NUL bytes are rejected. Everything is the
// sandbox's own file system, so ".." and symlinks resolve as the sandbox's
// kernel resolves them (there is nothing outside to escape to). Stat, list
// and remove act on symlinks themselves; read, write and watch follow
// them.
//
// It runs inside the sandbox; it imports only the standard library,
// golang.org/x/sys and api.
package files

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kiln-sh/kiln/api"
)

// User is the account whose permissions an operation has.
type User struct {
	Name   string
	UID    uint32
	GID    uint32
	Groups []uint32
	Home   string
}

// Service performs file operations.
type Service struct {
	log *slog.Logger
}

// New returns a Service.
func New(log *slog.Logger) *Service {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Service{log: log}
}

// Resolve turns a caller's path into a clean absolute path.
func Resolve(u User, p string) (string, error) {
	switch {
	case p == "":
		return "", apiErrorf(api.CodeInvalidArgument, "path is empty")
	case strings.ContainsRune(p, 0):
		return "", apiErrorf(api.CodeInvalidArgument, "path contains a NUL byte")
	case !filepath.IsAbs(p):
		if !filepath.IsAbs(u.Home) { // none, or a relative one in a tampered /etc/passwd
			return "", apiErrorf(api.CodeInvalidArgument, "relative path %q but user %s has no home", p, u.Name)
		}
		if strings.ContainsRune(u.Home, 0) {
			return "", apiErrorf(api.CodeInvalidArgument, "user %s has a home with a NUL byte", u.Name)
		}
		p = filepath.Join(u.Home, p)
	}
	return filepath.Clean(p), nil
}

// asUser runs fn with the permissions of u. When the agent is not root it
// cannot switch, and fn runs with the agent's own ids.
func asUser(u User, fn func() error) error {
	euid := os.Geteuid()
	if euid != 0 || (u.UID == 0 && u.GID == 0) {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the thread ends with this goroutine, and its
		// switched credentials with it.
		runtime.LockOSThread()
		if err := setThreadCreds(u); err != nil {
			errc <- fmt.Errorf("switching to user %s: %w", u.Name, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// setThreadCreds switches the calling thread's effective ids. The raw
// syscalls affect only this thread (unlike syscall.Setresuid, which Go
// applies to all threads). Real and saved ids stay root.
func setThreadCreds(u User) error {
	var gp unsafe.Pointer
	if len(u.Groups) > 0 {
		gp = unsafe.Pointer(&u.Groups[0])
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(u.Groups)), uintptr(gp), 0); e != 0 {
		return fmt.Errorf("setgroups: %w", e)
	}
	keep := ^uintptr(0) // -1: unchanged
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, keep, uintptr(u.GID), keep); e != 0 {
		return fmt.Errorf("setresgid: %w", e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, keep, uintptr(u.UID), keep); e != 0 {
		return fmt.Errorf("setresuid: %w", e)
	}
	return nil
}

func apiErrorf(code api.ErrorCode, format string, args ...any) *api.Error {
	return &api.Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// classify maps a file system error to the client's error classes; verb
// and path name what was being done ("reading", "/home/user/x").
func classify(verb, path string, err error) error {
	if err == nil {
		return nil
	}
	var ae *api.Error
	if errors.As(err, &ae) {
		return err
	}
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return fmt.Errorf("%s %s: %w", verb, path, err)
	}
	code := api.CodeInternal
	msg := fmt.Sprintf("%s %s: %v", verb, path, errno)
	switch errno {
	case unix.ENOENT:
		code, msg = api.CodeNotFound, fmt.Sprintf("%s %s: no such file or directory", verb, path)
	case unix.EEXIST:
		code = api.CodeAlreadyExists
	case unix.EACCES, unix.EPERM:
		code = api.CodePermissionDenied
	case unix.ENOSPC, unix.EDQUOT:
		code, msg = api.CodeResourceExhausted, fmt.Sprintf("disk full: %s %s: %v", verb, path, errno)
	case unix.EMFILE, unix.ENFILE, unix.ENOMEM, unix.EFBIG:
		code = api.CodeResourceExhausted
	case unix.ENOTDIR, unix.EISDIR, unix.EINVAL, unix.ENAMETOOLONG, unix.ELOOP,
		unix.ESPIPE, unix.ENOTTY, unix.EOPNOTSUPP, unix.EBADF:
		code = api.CodeInvalidArgument
	case unix.ENOTEMPTY, unix.EXDEV, unix.EROFS, unix.EBUSY, unix.ETXTBSY,
		unix.EIO, unix.ENXIO, unix.ENODEV, unix.EAGAIN, unix.EPIPE:
		// The file's state or kind, not the agent, is why it failed
		// (/proc/self/mem's EIO, /dev/tty's ENXIO without a terminal).
		code = api.CodeFailedPrecondition
	}
	return &api.Error{Code: code, Message: msg}
}

// notRegular refuses a read or write of what is not a regular file: a
// FIFO or socket would block, a device may never end.
func notRegular(verb, path string, fi fs.FileInfo) error {
	kind := "special file"
	switch m := fi.Mode(); {
	case m.IsDir():
		kind = "directory"
	case m&fs.ModeNamedPipe != 0:
		kind = "named pipe (FIFO)"
	case m&fs.ModeSocket != 0:
		kind = "socket"
	case m&fs.ModeCharDevice != 0:
		kind = "character device"
	case m&fs.ModeDevice != 0:
		kind = "block device"
	}
	return apiErrorf(api.CodeInvalidArgument, "%s %s: is a %s, not a regular file", verb, path, kind)
}

// fileInfo describes fi, found at path.
func fileInfo(path string, fi fs.FileInfo, n *names) api.FileInfo {
	info := api.FileInfo{
		Name:    filepath.Base(path),
		Path:    path,
		Size:    fi.Size(),
		Mode:    uint32(fi.Mode().Perm()),
		ModTime: fi.ModTime(),
	}
	switch m := fi.Mode(); {
	case m.IsRegular():
		info.Type = api.FileRegular
	case m.IsDir():
		info.Type = api.FileDir
	case m&fs.ModeSymlink != 0:
		info.Type = api.FileSymlink
		info.SymlinkTarget, _ = os.Readlink(path)
	default:
		info.Type = api.FileOther
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && n != nil {
		info.Owner = n.user(st.Uid)
		info.Group = n.group(st.Gid)
	}
	info.Mode |= specialBits(fi.Mode())
	return info
}

// specialBits returns the setuid, setgid and sticky bits as in chmod(2).
func specialBits(m fs.FileMode) uint32 {
	var b uint32
	if m&fs.ModeSetuid != 0 {
		b |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		b |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		b |= 0o1000
	}
	return b
}
