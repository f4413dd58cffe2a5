package image

import (
	"errors"
	"fmt"
	"path"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// errThrough marks an entry whose path goes through a symlink or a
// non-directory inside the layer: it is refused, never followed.
var errThrough = fmt.Errorf("its path goes through a symlink or a file: %w", errdefs.ErrInvalidArgument)

// beneath resolves paths inside one directory with openat2: no symlinks,
// no "..", no crossing mounts, so the kernel keeps every lookup inside it
// whatever the layer's entries have made of it.
type beneath struct {
	fd int // O_PATH descriptor of the directory
}

func openBeneath(dir string) (beneath, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return beneath{}, err
	}
	return beneath{fd: fd}, nil
}

func (b beneath) close() { unix.Close(b.fd) }

// open opens rel (relative, clean, "." for the directory itself).
func (b beneath) open(rel string, flags uint64) (int, error) {
	fd, err := unix.Openat2(b.fd, rel, &unix.OpenHow{
		Flags:   flags | unix.O_CLOEXEC | unix.O_NOFOLLOW,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.EXDEV) {
		return -1, errThrough
	}
	return fd, err
}

// parent opens the directory rel is in, creating missing directories
// (mode 0755, root's) on the way when create is set, and returns it with
// rel's last component.
func (b beneath) parent(rel string, create bool) (int, string, error) {
	dir, base := path.Split(rel)
	dir = strings.TrimSuffix(dir, "/")
	if dir == "" {
		dir = "."
	}
	fd, err := b.open(dir, unix.O_PATH|unix.O_DIRECTORY)
	if errors.Is(err, unix.ENOENT) && create {
		if err = b.mkdirAll(dir); err == nil {
			fd, err = b.open(dir, unix.O_PATH|unix.O_DIRECTORY)
		}
	}
	if err != nil {
		return -1, "", err
	}
	return fd, base, nil
}

// mkdirAll creates the missing directories of rel, one component at a
// time, each opened without following symlinks.
func (b beneath) mkdirAll(rel string) error {
	cur, err := unix.Dup(b.fd)
	if err != nil {
		return err
	}
	defer func() { unix.Close(cur) }()
	for _, c := range strings.Split(rel, "/") {
		if err := unix.Mkdirat(cur, c, 0o755); err == nil {
			if err := unix.Fchmodat(cur, c, 0o755, 0); err != nil {
				return err
			}
		} else if !errors.Is(err, unix.EEXIST) {
			return err
		}
		next, err := beneath{cur}.open(c, unix.O_PATH|unix.O_DIRECTORY)
		if err != nil {
			return err
		}
		unix.Close(cur)
		cur = next
	}
	return nil
}

// lstat stats base in the directory pfd without following a symlink; ok
// is false when it does not exist.
func lstat(pfd int, base string) (st unix.Stat_t, ok bool, err error) {
	err = unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		return st, false, nil
	}
	return st, err == nil, err
}

// procPath names base in the directory pfd for the calls that have no
// *at form (lsetxattr): the kernel resolves the descriptor itself.
func procPath(pfd int, base string) string {
	return fmt.Sprintf("/proc/self/fd/%d/%s", pfd, base)
}
