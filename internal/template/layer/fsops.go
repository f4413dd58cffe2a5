package layer

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// The helpers here touch a directory tree only through file descriptors:
// every path is opened beneath a tree's root with openat2(RESOLVE_BENEATH |
// RESOLVE_NO_SYMLINKS), and every final component is handled with an *at
// call that does not follow it. So nothing a tree holds (a symlink to /etc,
// a hard-coded "..") can make a write land outside it or through a link.

// openBeneath opens rel (slash-separated, relative; "" or "." is dir itself)
// beneath dir without following any symlink.
func openBeneath(dir *os.File, rel string, flags int) (*os.File, error) {
	if rel == "" {
		rel = "."
	}
	how := unix.OpenHow{
		Flags:   uint64(flags | unix.O_CLOEXEC | unix.O_NOFOLLOW),
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	}
	if flags&unix.O_CREAT != 0 {
		how.Mode = 0o600
	}
	for {
		fd, err := unix.Openat2(int(dir.Fd()), rel, &how)
		if err == unix.EINTR || err == unix.EAGAIN {
			continue // EAGAIN: a concurrent rename elsewhere on the host
		}
		if err != nil {
			return nil, &os.PathError{Op: "open", Path: rel, Err: err}
		}
		return os.NewFile(uintptr(fd), rel), nil
	}
}

// openDir opens the directory rel beneath dir.
func openDir(dir *os.File, rel string) (*os.File, error) {
	return openBeneath(dir, rel, unix.O_RDONLY|unix.O_DIRECTORY)
}

// lstatAt is fstatat(dir, name, AT_SYMLINK_NOFOLLOW) for a single name.
func lstatAt(dir *os.File, name string) (unix.Stat_t, error) {
	var st unix.Stat_t
	err := unix.Fstatat(int(dir.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW)
	if err != nil {
		return st, &os.PathError{Op: "lstat", Path: name, Err: err}
	}
	return st, nil
}

// procPath names name in the open directory dir for the l*xattr calls,
// which do not follow name itself.
func procPath(dir *os.File, name string) string {
	p := "/proc/self/fd/" + strconv.Itoa(int(dir.Fd()))
	if name != "" && name != "." {
		p += "/" + name
	}
	return p
}

// listXattrs returns the extended attributes of name in dir (dir itself
// for ""), without following name.
func listXattrs(dir *os.File, name string) (map[string]string, error) {
	p := procPath(dir, name)
	buf := make([]byte, 4096)
	for {
		n, err := unix.Llistxattr(p, buf)
		if err == unix.ERANGE {
			buf = make([]byte, len(buf)*4)
			continue
		}
		if err == unix.ENOTSUP {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("listing xattrs of %s: %w", name, err)
		}
		out := map[string]string{}
		for _, k := range strings.Split(string(buf[:n]), "\x00") {
			if k == "" {
				continue
			}
			v, err := getXattr(p, k)
			if err != nil {
				return nil, fmt.Errorf("reading xattr %s of %s: %w", k, name, err)
			}
			out[k] = v
		}
		return out, nil
	}
}

func getXattr(p, k string) (string, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Lgetxattr(p, k, buf)
		if err == unix.ERANGE {
			buf = make([]byte, len(buf)*4)
			continue
		}
		if err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
}

// removeAt removes name in dir and, for a directory, everything under it,
// without following symlinks. A missing name is not an error.
func removeAt(dir *os.File, name string) error {
	st, err := lstatAt(dir, name)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return unlinkAt(dir, name, 0)
	}
	sub, err := openDir(dir, name)
	if err != nil {
		return err
	}
	names, err := sub.Readdirnames(-1)
	if err == nil {
		for _, n := range names {
			if err = removeAt(sub, n); err != nil {
				break
			}
		}
	}
	sub.Close()
	if err != nil {
		return err
	}
	return unlinkAt(dir, name, unix.AT_REMOVEDIR)
}

func unlinkAt(dir *os.File, name string, flags int) error {
	if err := unix.Unlinkat(int(dir.Fd()), name, flags); err != nil && err != unix.ENOENT {
		return &os.PathError{Op: "remove", Path: name, Err: err}
	}
	return nil
}

// cleanRel turns a tar entry name or a path inside a tree into a clean
// relative path ("." for the root). It refuses names that climb out.
func cleanRel(name string) (string, error) {
	p := path.Clean("/" + name)
	if strings.Contains(name, "\x00") {
		return "", fmt.Errorf("path %q: %w", errdefs.Clip(name), errdefs.ErrInvalidArgument)
	}
	for _, c := range strings.Split(name, "/") {
		if c == ".." {
			return "", fmt.Errorf("path %q leaves its tree: %w", errdefs.Clip(name), errdefs.ErrInvalidArgument)
		}
	}
	if p == "/" {
		return ".", nil
	}
	return p[1:], nil
}

// splitRel returns rel's parent ("" for the root) and last component.
func splitRel(rel string) (string, string) {
	i := strings.LastIndexByte(rel, '/')
	if i < 0 {
		return "", rel
	}
	return rel[:i], rel[i+1:]
}

// tree writes entries, described by tar headers, into a directory.
type tree struct {
	root *os.File
	// limit is the most bytes of file content the tree may receive (0:
	// no limit); written counts them.
	limit, written int64
	// parent describes a missing parent directory (rel) that put creates.
	parent func(rel string) (*tar.Header, error)
	// xattr keeps an extended attribute of an entry.
	xattr func(k, v string) bool
	// noDevices skips every device node, whiteouts included (uploaded
	// content must not delete what the layers below hold).
	noDevices bool
	// dirs are the directories whose times are set at the end, after
	// their contents (writing into a directory changes its mtime).
	dirs []*tar.Header
	log  *slog.Logger
}

// rootParent is the default parent maker: 0755, root-owned, now.
func rootParent(rel string) (*tar.Header, error) {
	now := time.Now()
	return &tar.Header{Name: rel, Typeflag: tar.TypeDir, Mode: 0o755, ModTime: now, AccessTime: now}, nil
}

// openParent opens the parent directory of rel, creating missing ones.
func (t *tree) openParent(rel string) (*os.File, string, error) {
	dir, name := splitRel(rel)
	d, err := openDir(t.root, dir)
	if errors.Is(err, unix.ENOENT) {
		if err = t.mkdirs(dir); err == nil {
			d, err = openDir(t.root, dir)
		}
	}
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.EXDEV) {
		return nil, "", fmt.Errorf("%s: parent is not a directory (a symlink or file): %w", errdefs.Clip(rel), errdefs.ErrInvalidArgument)
	}
	if err != nil {
		return nil, "", err
	}
	return d, name, nil
}

// mkdirs creates the missing directories of rel, top-down.
func (t *tree) mkdirs(rel string) error {
	if rel == "" || rel == "." {
		return nil
	}
	for i := 0; i <= len(rel); i++ {
		if i < len(rel) && rel[i] != '/' {
			continue
		}
		p := rel[:i]
		dir, name := splitRel(p)
		d, err := openDir(t.root, dir)
		if err != nil {
			return err
		}
		_, err = lstatAt(d, name)
		if errors.Is(err, unix.ENOENT) {
			var h *tar.Header
			mk := t.parent
			if mk == nil {
				mk = rootParent
			}
			if h, err = mk(p); err == nil {
				err = t.putIn(d, name, h, nil)
			}
		}
		d.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// put creates the entry h describes (h.Name relative to the root, already
// clean) with the content r for regular files. An existing entry is
// replaced, except that a directory over a directory keeps its contents
// and takes h's metadata. Hard links name their target relative to the
// root; block and character devices other than 0:0 (a whiteout) are
// skipped with a warning.
func (t *tree) put(h *tar.Header, r io.Reader) error {
	if h.Name == "." {
		return t.setMeta(t.root, "", h)
	}
	d, name, err := t.openParent(h.Name)
	if err != nil {
		return err
	}
	defer d.Close()
	return t.putIn(d, name, h, r)
}

func (t *tree) putIn(d *os.File, name string, h *tar.Header, r io.Reader) error {
	fd := int(d.Fd())
	st, err := lstatAt(d, name)
	exists := err == nil
	isDir := h.Typeflag == tar.TypeDir
	if exists && !(isDir && st.Mode&unix.S_IFMT == unix.S_IFDIR) {
		if err := removeAt(d, name); err != nil {
			return err
		}
		exists = false
	}
	perm := uint32(h.Mode & 0o7777)
	switch h.Typeflag {
	case tar.TypeDir:
		if !exists {
			if err := unix.Mkdirat(fd, name, 0o700); err != nil {
				return &os.PathError{Op: "mkdir", Path: h.Name, Err: err}
			}
		}
	case tar.TypeReg, tar.TypeRegA:
		f, err := openBeneath(d, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL)
		if err != nil {
			return err
		}
		err = t.copyContent(f, r)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("writing %s: %w", errdefs.Clip(h.Name), err)
		}
	case tar.TypeSymlink:
		if err := unix.Symlinkat(h.Linkname, fd, name); err != nil {
			return &os.PathError{Op: "symlink", Path: h.Name, Err: err}
		}
	case tar.TypeLink:
		target, err := cleanRel(h.Linkname)
		if err != nil {
			return err
		}
		tdir, tname := splitRel(target)
		td, err := openDir(t.root, tdir)
		if err != nil {
			return fmt.Errorf("hard link %s: target %s: %w", errdefs.Clip(h.Name), errdefs.Clip(h.Linkname), err)
		}
		err = unix.Linkat(int(td.Fd()), tname, fd, name, 0)
		td.Close()
		if err != nil {
			return fmt.Errorf("hard link %s: %w", errdefs.Clip(h.Name), err)
		}
		return nil // a link shares its target's metadata
	case tar.TypeChar, tar.TypeBlock:
		if t.noDevices || h.Typeflag == tar.TypeBlock || h.Devmajor != 0 || h.Devminor != 0 {
			t.warn("skipping a device node", h.Name)
			return nil
		}
		if err := unix.Mknodat(fd, name, unix.S_IFCHR, 0); err != nil {
			return &os.PathError{Op: "mknod", Path: h.Name, Err: err}
		}
	case tar.TypeFifo:
		if err := unix.Mknodat(fd, name, unix.S_IFIFO|0o600, 0); err != nil {
			return &os.PathError{Op: "mkfifo", Path: h.Name, Err: err}
		}
	default:
		t.warn(fmt.Sprintf("skipping an entry of type %q", h.Typeflag), h.Name)
		return nil
	}
	if isDir {
		t.dirs = append(t.dirs, h)
		return t.setOwnerMode(d, name, h, perm, false)
	}
	if err := t.setOwnerMode(d, name, h, perm, h.Typeflag == tar.TypeSymlink); err != nil {
		return err
	}
	return setTimes(d, name, h)
}

func (t *tree) warn(msg, name string) {
	if t.log != nil {
		t.log.Warn(msg, "path", name)
	}
}

// copyContent copies r into f, counting against the tree's limit.
func (t *tree) copyContent(f *os.File, r io.Reader) error {
	if r == nil {
		return nil
	}
	if t.limit <= 0 {
		n, err := io.Copy(f, r)
		t.written += n
		return err
	}
	left := t.limit - t.written
	n, err := io.Copy(f, io.LimitReader(r, left+1))
	t.written += n
	if err != nil {
		return err
	}
	if n > left {
		return fmt.Errorf("layer over its limit of %d bytes: %w", t.limit, errdefs.ErrResourceExhausted)
	}
	return nil
}

// setOwnerMode sets owner, mode and xattrs of name in d (d itself for "").
func (t *tree) setOwnerMode(d *os.File, name string, h *tar.Header, perm uint32, symlink bool) error {
	fd := int(d.Fd())
	var err error
	if name == "" {
		err = unix.Fchown(fd, h.Uid, h.Gid)
	} else {
		err = unix.Fchownat(fd, name, h.Uid, h.Gid, unix.AT_SYMLINK_NOFOLLOW)
	}
	if err != nil {
		return fmt.Errorf("chown %s: %w", errdefs.Clip(h.Name), err)
	}
	if !symlink {
		if name == "" {
			err = unix.Fchmod(fd, perm)
		} else {
			err = unix.Fchmodat(fd, name, perm, 0)
		}
		if err != nil {
			return fmt.Errorf("chmod %s: %w", errdefs.Clip(h.Name), err)
		}
	}
	p := procPath(d, name)
	for k, v := range h.PAXRecords {
		k, ok := strings.CutPrefix(k, paxXattr)
		if !ok || (t.xattr != nil && !t.xattr(k, v)) {
			continue
		}
		if err := unix.Lsetxattr(p, k, []byte(v), 0); err != nil {
			return fmt.Errorf("setting xattr %s on %s: %w", k, errdefs.Clip(h.Name), err)
		}
	}
	return nil
}

// setMeta applies all of h's metadata to name in d (d itself for "").
func (t *tree) setMeta(d *os.File, name string, h *tar.Header) error {
	if err := t.setOwnerMode(d, name, h, uint32(h.Mode&0o7777), false); err != nil {
		return err
	}
	return setTimes(d, name, h)
}

// finish sets the times of the directories put made, deepest first.
func (t *tree) finish() error {
	for i := len(t.dirs) - 1; i >= 0; i-- {
		h := t.dirs[i]
		dir, name := splitRel(h.Name)
		d, err := openDir(t.root, dir)
		if errors.Is(err, unix.ENOENT) {
			continue // moved or replaced since
		}
		if err != nil {
			return err
		}
		err = setTimes(d, name, h)
		d.Close()
		if err != nil && !errors.Is(err, unix.ENOENT) {
			return err
		}
	}
	t.dirs = nil
	return nil
}

const paxXattr = "SCHILY.xattr."

func setTimes(d *os.File, name string, h *tar.Header) error {
	at := h.AccessTime
	if at.IsZero() {
		at = h.ModTime
	}
	ts := []unix.Timespec{unix.NsecToTimespec(at.UnixNano()), unix.NsecToTimespec(h.ModTime.UnixNano())}
	var err error
	if name == "" {
		err = unix.UtimesNano(procPath(d, ""), ts)
	} else {
		err = unix.UtimesNanoAt(int(d.Fd()), name, ts, unix.AT_SYMLINK_NOFOLLOW)
	}
	if err != nil {
		return &os.PathError{Op: "utimes", Path: h.Name, Err: err}
	}
	return nil
}

// header describes the entry name in d as a tar header (no content, no
// hard-link detection): what Capture and the lower view copy.
func header(d *os.File, name, rel string, st *unix.Stat_t) (*tar.Header, error) {
	h := &tar.Header{
		Name:       rel,
		Mode:       int64(st.Mode & 0o7777),
		Uid:        int(st.Uid),
		Gid:        int(st.Gid),
		ModTime:    time.Unix(st.Mtim.Unix()),
		AccessTime: time.Unix(st.Atim.Unix()),
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		h.Typeflag = tar.TypeDir
	case unix.S_IFREG:
		h.Typeflag, h.Size = tar.TypeReg, st.Size
	case unix.S_IFLNK:
		h.Typeflag = tar.TypeSymlink
		buf := make([]byte, unix.PathMax)
		n, err := unix.Readlinkat(int(d.Fd()), name, buf)
		if err != nil {
			return nil, &os.PathError{Op: "readlink", Path: rel, Err: err}
		}
		h.Linkname = string(buf[:n])
	case unix.S_IFCHR:
		h.Typeflag = tar.TypeChar
		h.Devmajor, h.Devminor = int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
	case unix.S_IFBLK:
		h.Typeflag = tar.TypeBlock
	case unix.S_IFIFO:
		h.Typeflag = tar.TypeFifo
	default:
		h.Typeflag = 0 // a socket: skipped by put
	}
	x, err := listXattrs(d, name)
	if err != nil {
		return nil, err
	}
	if len(x) > 0 {
		h.PAXRecords = map[string]string{}
		for k, v := range x {
			h.PAXRecords[paxXattr+k] = v
		}
	}
	return h, nil
}
