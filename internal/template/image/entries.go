package image

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

const (
	whiteoutPrefix = ".wh."
	opaqueMarker   = ".wh..wh..opq"
	opaqueXattr    = "trusted.overlay.opaque"
	xattrPAXPrefix = "SCHILY.xattr."
	// entryCost is what each entry counts against the size limit on top
	// of its content: its inode and name.
	entryCost = 512
)

// unpacker writes one layer's tar entries into a directory.
type unpacker struct {
	b        beneath
	log      *slog.Logger
	max      int64
	used     int64
	dirTimes map[string][]unix.Timespec // applied last: entries change them
	rootSeen bool
}

// run unpacks every entry of tr.
func (u *unpacker) run(ctx context.Context, tr *tar.Reader) error {
	u.dirTimes = map[string][]unix.Timespec{}
	return walkTar(ctx, tr, func(h *tar.Header) error {
		if err := u.charge(entryCost); err != nil {
			return err
		}
		if err := u.entry(h, tr); err != nil {
			if errors.Is(err, errLimit) {
				return err
			}
			return fmt.Errorf("entry %q: %w", errdefs.Clip(h.Name), err)
		}
		return nil
	})
}

func (u *unpacker) charge(n int64) error {
	u.used += n
	if u.max > 0 && u.used > u.max {
		return errLimit
	}
	return nil
}

// entry unpacks one entry. Its name is made relative to the layer's root
// ("/abs" is "abs", "../x" is "x"), and the kernel refuses any lookup that
// would go through a symlink.
func (u *unpacker) entry(h *tar.Header, r io.Reader) error {
	rel := cleanName(h.Name)
	base := path.Base(rel)
	switch {
	case rel == "":
		if h.Typeflag != tar.TypeDir {
			return fmt.Errorf("the layer's root is not a directory: %w", errdefs.ErrInvalidArgument)
		}
		u.rootSeen = true
		return u.dir(".", h)
	case base == opaqueMarker:
		return u.opaque(path.Dir(rel))
	case strings.HasPrefix(base, whiteoutPrefix):
		name := strings.TrimPrefix(base, whiteoutPrefix)
		if name == "" || name == "." || name == ".." {
			return fmt.Errorf("malformed whiteout: %w", errdefs.ErrInvalidArgument)
		}
		return u.whiteout(path.Join(path.Dir(rel), name))
	}
	switch h.Typeflag {
	case tar.TypeDir:
		return u.dir(rel, h)
	case tar.TypeReg, tar.TypeRegA:
		return u.file(rel, h, r)
	case tar.TypeSymlink:
		return u.symlink(rel, h)
	case tar.TypeLink:
		return u.hardlink(rel, h)
	case tar.TypeFifo:
		return u.fifo(rel, h)
	case tar.TypeChar, tar.TypeBlock:
		if h.Typeflag == tar.TypeChar && h.Devmajor == 0 && h.Devminor == 0 {
			return u.whiteout(rel) // already in overlay form
		}
		u.log.Warn("layer: device node left out", "entry", errdefs.Clip(h.Name))
		return nil
	case tar.TypeXGlobalHeader:
		return nil
	}
	u.log.Warn("layer: entry of unsupported type left out", "entry", errdefs.Clip(h.Name), "type", string(h.Typeflag))
	return nil
}

// create opens rel's parent (creating missing directories) and clears
// rel for a new entry: an existing entry is removed, except a directory
// when keepDir is set (directories merge). The caller closes pfd.
func (u *unpacker) create(rel string, keepDir bool) (pfd int, base string, exists bool, err error) {
	pfd, base, err = u.b.parent(rel, true)
	if err != nil {
		return -1, "", false, err
	}
	st, ok, err := lstat(pfd, base)
	if err != nil || !ok {
		return pfd, base, false, err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if keepDir {
			return pfd, base, true, nil
		}
		err = removeAll(pfd, base)
	} else {
		err = unix.Unlinkat(pfd, base, 0)
	}
	if err != nil {
		unix.Close(pfd)
		return -1, "", false, err
	}
	return pfd, base, false, nil
}

func (u *unpacker) dir(rel string, h *tar.Header) error {
	if rel == "." {
		fd, err := u.b.open(".", unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		u.dirTimes["."] = times(h)
		return u.fdMeta(fd, h)
	}
	pfd, base, exists, err := u.create(rel, true)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if !exists {
		if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
			return err
		}
	}
	fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	u.dirTimes[rel] = times(h)
	return u.fdMeta(fd, h)
}

func (u *unpacker) file(rel string, h *tar.Header, r io.Reader) error {
	if err := u.charge(h.Size); err != nil {
		return err
	}
	pfd, base, _, err := u.create(rel, false)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), base)
	defer f.Close()
	if _, err := io.Copy(f, r); err != nil {
		return err
	}
	if err := u.fdMeta(fd, h); err != nil {
		return err
	}
	return unix.UtimesNanoAt(pfd, base, times(h), unix.AT_SYMLINK_NOFOLLOW)
}

func (u *unpacker) symlink(rel string, h *tar.Header) error {
	pfd, base, _, err := u.create(rel, false)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if err := unix.Symlinkat(h.Linkname, pfd, base); err != nil {
		return err
	}
	return u.pathMeta(pfd, base, h, false)
}

func (u *unpacker) fifo(rel string, h *tar.Header) error {
	pfd, base, _, err := u.create(rel, false)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if err := unix.Mknodat(pfd, base, unix.S_IFIFO|0o600, 0); err != nil {
		return err
	}
	return u.pathMeta(pfd, base, h, true)
}

// hardlink links rel to an earlier regular entry of the layer.
func (u *unpacker) hardlink(rel string, h *tar.Header) error {
	target := cleanName(h.Linkname)
	if target == "" {
		return fmt.Errorf("hard link to the layer's root: %w", errdefs.ErrInvalidArgument)
	}
	tfd, tbase, err := u.b.parent(target, false)
	if errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("hard link to %q, which the layer does not hold: %w", errdefs.Clip(h.Linkname), errdefs.ErrInvalidArgument)
	}
	if err != nil {
		return err
	}
	defer unix.Close(tfd)
	st, ok, err := lstat(tfd, tbase)
	if err != nil {
		return err
	}
	if !ok || st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return fmt.Errorf("hard link to %q, which the layer does not hold as a file: %w", errdefs.Clip(h.Linkname), errdefs.ErrInvalidArgument)
	}
	if rel == target {
		return nil
	}
	pfd, base, _, err := u.create(rel, false)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	return unix.Linkat(tfd, tbase, pfd, base, 0)
}

// whiteout makes rel a character device 0:0: overlayfs's mark for a path
// deleted from the layers below.
func (u *unpacker) whiteout(rel string) error {
	pfd, base, _, err := u.create(rel, false)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	return unix.Mknodat(pfd, base, unix.S_IFCHR|0o600, 0)
}

// opaque marks the directory rel (creating it if the layer has not yet)
// as replacing the lower directory of the same path entirely.
func (u *unpacker) opaque(rel string) error {
	if rel != "." {
		pfd, base, exists, err := u.create(rel, true)
		if err != nil {
			return err
		}
		if !exists {
			err = unix.Mkdirat(pfd, base, 0o755)
		}
		unix.Close(pfd)
		if err != nil {
			return err
		}
	}
	fd, err := u.b.open(rel, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Fsetxattr(fd, opaqueXattr, []byte("y"), 0)
}

// fdMeta gives an open file or directory the entry's owner, mode and
// xattrs (its times are set by the caller: a directory's last).
func (u *unpacker) fdMeta(fd int, h *tar.Header) error {
	if err := unix.Fchown(fd, h.Uid, h.Gid); err != nil {
		return err
	}
	// After the chown, which clears setuid and setgid.
	if err := unix.Fchmod(fd, uint32(h.Mode&0o7777)); err != nil {
		return err
	}
	return u.xattrs(h, func(k string, v []byte) error { return unix.Fsetxattr(fd, k, v, 0) })
}

// pathMeta gives base in pfd (a symlink or FIFO, not opened) the entry's
// owner, mode (chmod: not for symlinks), xattrs and times.
func (u *unpacker) pathMeta(pfd int, base string, h *tar.Header, chmod bool) error {
	if err := unix.Fchownat(pfd, base, h.Uid, h.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if chmod {
		if err := unix.Fchmodat(pfd, base, uint32(h.Mode&0o7777), 0); err != nil {
			return err
		}
	}
	p := procPath(pfd, base)
	if err := u.xattrs(h, func(k string, v []byte) error { return unix.Lsetxattr(p, k, v, 0) }); err != nil {
		return err
	}
	return unix.UtimesNanoAt(pfd, base, times(h), unix.AT_SYMLINK_NOFOLLOW)
}

// xattrs sets the entry's PAX xattrs (SCHILY.xattr.NAME) with set, except
// overlayfs's own (trusted.overlay.*), which only Kiln writes.
func (u *unpacker) xattrs(h *tar.Header, set func(string, []byte) error) error {
	var names []string
	for k := range h.PAXRecords {
		if strings.HasPrefix(k, xattrPAXPrefix) {
			names = append(names, strings.TrimPrefix(k, xattrPAXPrefix))
		}
	}
	sort.Strings(names)
	for _, k := range names {
		if strings.HasPrefix(k, "trusted.overlay.") {
			u.log.Warn("layer: overlayfs xattr left out", "entry", errdefs.Clip(h.Name), "xattr", errdefs.Clip(k))
			continue
		}
		err := set(k, []byte(h.PAXRecords[xattrPAXPrefix+k]))
		if errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.EPERM) {
			// A namespace this filesystem or file type does not take
			// (user.* on a symlink): the file is still what it was.
			u.log.Warn("layer: xattr left out", "entry", errdefs.Clip(h.Name), "xattr", errdefs.Clip(k), "err", err)
			continue
		}
		if err != nil {
			return fmt.Errorf("xattr %q: %w", errdefs.Clip(k), err)
		}
	}
	return nil
}

// finish sets the directories' times, which every entry written into
// them changed, and gives the root 0755 when the layer did not say.
func (u *unpacker) finish() error {
	if !u.rootSeen {
		if err := unix.Fchmodat(u.b.fd, ".", 0o755, 0); err != nil {
			return err
		}
	}
	for rel, ts := range u.dirTimes {
		pfd, base, err := u.b.parent(rel, false)
		if err != nil {
			continue // removed by a later entry
		}
		if st, ok, _ := lstat(pfd, base); ok && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			err = unix.UtimesNanoAt(pfd, base, ts, unix.AT_SYMLINK_NOFOLLOW)
		}
		unix.Close(pfd)
		if err != nil {
			return err
		}
	}
	return nil
}

// times is an entry's access and modification times for utimensat.
func times(h *tar.Header) []unix.Timespec {
	at := h.AccessTime
	if at.IsZero() {
		at = h.ModTime
	}
	return []unix.Timespec{timespec(at), timespec(h.ModTime)}
}

func timespec(t time.Time) unix.Timespec {
	if t.IsZero() {
		t = time.Unix(0, 0)
	}
	return unix.NsecToTimespec(t.UnixNano())
}

// removeAll removes the directory base in pfd and everything in it.
func removeAll(pfd int, base string) error {
	fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	d := os.NewFile(uintptr(fd), base)
	names, err := d.Readdirnames(-1)
	if err != nil {
		d.Close()
		return err
	}
	for _, n := range names {
		var st unix.Stat_t
		if err = unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil {
			if st.Mode&unix.S_IFMT == unix.S_IFDIR {
				err = removeAll(fd, n)
			} else {
				err = unix.Unlinkat(fd, n, 0)
			}
		}
		if err != nil {
			d.Close()
			return err
		}
	}
	d.Close()
	return unix.Unlinkat(pfd, base, unix.AT_REMOVEDIR)
}
