package volume

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"
	"time"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/rootfs"
)

// The volume content API, host-side: what E2B's SDK's Volume file methods
// reach without a sandbox. A volume's files were written by sandboxes and
// are untrusted: every access goes through an os.Root on the volume's
// data directory, which refuses to follow a symlink out of it, and the
// host mount itself is nodev and nosuid.

// Entry describes one file in a volume. Path is from the volume's root,
// starting with '/'.
type Entry struct {
	Name   string
	Path   string
	Type   string // file, directory, symlink or unknown
	Target string // a symlink's target
	Size   int64
	Mode   uint32 // permission bits
	UID    uint32
	GID    uint32
	Atime  time.Time
	Mtime  time.Time
	Ctime  time.Time
}

// Dir is an open volume's data directory.
type Dir struct {
	root *os.Root
}

// Open opens volume id's data directory, mounting it if needed; the
// caller closes it. No owner is checked: the caller proved its right to
// volume id (E2B's volume token).
func (m *Manager) Open(ctx context.Context, id string) (*Dir, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, err := m.cfg.Store.GetVolume(ctx, id); err != nil {
		return nil, err
	}
	if err := m.mount(id); err != nil {
		return nil, err
	}
	r, err := os.OpenRoot(rootfs.VolumeData(m.dir(id)))
	if err != nil {
		return nil, fmt.Errorf("opening volume %s: %w", id, err)
	}
	return &Dir{root: r}, nil
}

// Close releases d.
func (d *Dir) Close() error { return d.root.Close() }

// rel turns a volume path ("/a/b", "a/b", "/") into one relative to the
// root ("a/b", ".").
func rel(p string) (string, error) {
	if strings.ContainsRune(p, 0) || len(p) > 4096 {
		return "", fmt.Errorf("path %q: %w", clip(p), errdefs.ErrInvalidArgument)
	}
	c := path.Clean("/" + p)
	if c == "/" {
		return ".", nil
	}
	return c[1:], nil
}

// classify gives a file system error its errdefs class.
func classify(p string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("path %q not found: %w", clip(p), errdefs.ErrNotFound)
	case errors.Is(err, fs.ErrExist):
		return fmt.Errorf("path %q exists: %w", clip(p), errdefs.ErrAlreadyExists)
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return fmt.Errorf("path %q: the volume is full: %w", clip(p), errdefs.ErrResourceExhausted)
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.ENOTEMPTY),
		errors.Is(err, syscall.ELOOP), strings.Contains(err.Error(), "escapes"):
		return fmt.Errorf("path %q: %w", clip(p), errdefs.ErrInvalidArgument)
	}
	return fmt.Errorf("path %q: %w", clip(p), err)
}

// Stat describes the file at p, not following a final symlink.
func (d *Dir) Stat(p string) (Entry, error) {
	r, err := rel(p)
	if err != nil {
		return Entry{}, err
	}
	fi, err := d.root.Lstat(r)
	if err != nil {
		return Entry{}, classify(p, err)
	}
	return d.entry(r, fi), nil
}

func (d *Dir) entry(r string, fi fs.FileInfo) Entry {
	e := Entry{Name: fi.Name(), Path: path.Clean("/" + r), Size: fi.Size(), Mode: uint32(fi.Mode().Perm()), Mtime: fi.ModTime().UTC()}
	if r == "." {
		e.Name = "/"
	}
	switch {
	case fi.Mode().IsRegular():
		e.Type = "file"
	case fi.IsDir():
		e.Type = "directory"
	case fi.Mode()&fs.ModeSymlink != 0:
		e.Type = "symlink"
		e.Target, _ = d.root.Readlink(r)
	default:
		e.Type = "unknown"
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.UID, e.GID = st.Uid, st.Gid
		e.Atime = time.Unix(st.Atim.Unix()).UTC()
		e.Ctime = time.Unix(st.Ctim.Unix()).UTC()
	}
	return e
}

// MaxListEntries bounds one listing.
const MaxListEntries = 10000

// List describes the entries of the directory p, and of its
// subdirectories down to depth levels (at least 1), at most
// MaxListEntries in all.
func (d *Dir) List(p string, depth int) ([]Entry, error) {
	r, err := rel(p)
	if err != nil {
		return nil, err
	}
	fi, err := d.root.Lstat(r)
	if err != nil {
		return nil, classify(p, err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("path %q is not a directory: %w", clip(p), errdefs.ErrInvalidArgument)
	}
	out := []Entry{}
	return out, d.list(r, max(depth, 1), &out)
}

func (d *Dir) list(r string, depth int, out *[]Entry) error {
	f, err := d.root.Open(r)
	if err != nil {
		return classify(r, err)
	}
	infos, err := f.Readdir(-1)
	f.Close()
	if err != nil {
		return classify(r, err)
	}
	for _, fi := range infos {
		if len(*out) >= MaxListEntries {
			return fmt.Errorf("more than %d entries: %w", MaxListEntries, errdefs.ErrResourceExhausted)
		}
		child := path.Join(r, fi.Name())
		*out = append(*out, d.entry(child, fi))
		if fi.IsDir() && depth > 1 {
			if err := d.list(child, depth-1, out); err != nil {
				return err
			}
		}
	}
	return nil
}

// Meta is what a write or SetMeta sets; nil fields keep the default
// (OwnerUID, OwnerGID; 0644 for files, 0755 for directories) or, for
// SetMeta, the file's own.
type Meta struct {
	UID, GID *uint32
	Mode     *uint32
}

// Mkdir makes the directory p (with parents, if parents) and returns it.
func (d *Dir) Mkdir(p string, m Meta, parents bool) (Entry, error) {
	r, err := rel(p)
	if err != nil {
		return Entry{}, err
	}
	mode := fs.FileMode(0o755)
	if m.Mode != nil {
		mode = fs.FileMode(*m.Mode) & fs.ModePerm
	}
	if parents && path.Dir(r) != "." {
		if err := d.mkdirs(path.Dir(r)); err != nil {
			return Entry{}, classify(p, err)
		}
	}
	if err := d.root.Mkdir(r, mode); err != nil {
		return Entry{}, classify(p, err)
	}
	return d.own(r, m, mode)
}

// WriteFile writes src to the file p, creating it (and its parent
// directories) or replacing its contents.
func (d *Dir) WriteFile(p string, src io.Reader, m Meta) (Entry, error) {
	r, err := rel(p)
	if err != nil {
		return Entry{}, err
	}
	if r == "." {
		return Entry{}, fmt.Errorf("path %q is the volume's root: %w", clip(p), errdefs.ErrInvalidArgument)
	}
	if dir := path.Dir(r); dir != "." {
		if err := d.mkdirs(dir); err != nil {
			return Entry{}, classify(p, err)
		}
	}
	mode := fs.FileMode(0o644)
	if m.Mode != nil {
		mode = fs.FileMode(*m.Mode) & fs.ModePerm
	}
	// O_NONBLOCK: a FIFO a sandbox left there must not hang us.
	f, err := d.root.OpenFile(r, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NONBLOCK, mode)
	if err != nil {
		return Entry{}, classify(p, err)
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return Entry{}, fmt.Errorf("path %q is not a regular file: %w", clip(p), errdefs.ErrInvalidArgument)
	}
	_, err = io.Copy(f, src)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Entry{}, classify(p, err)
	}
	return d.own(r, m, mode)
}

// mkdirs makes the directory r and its missing parents, owned like the
// volume's root (OwnerUID), so that the sandbox's user can write in them.
func (d *Dir) mkdirs(r string) error {
	cur := ""
	for part := range strings.SplitSeq(r, "/") {
		cur = path.Join(cur, part)
		err := d.root.Mkdir(cur, 0o755)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			return err
		}
		if err := d.root.Lchown(cur, OwnerUID, OwnerGID); err != nil {
			return err
		}
	}
	return nil
}

// own sets r's owner (and, for a file that existed, mode) after a write.
func (d *Dir) own(r string, m Meta, mode fs.FileMode) (Entry, error) {
	uid, gid := uint32(OwnerUID), uint32(OwnerGID)
	if m.UID != nil {
		uid = *m.UID
	}
	if m.GID != nil {
		gid = *m.GID
	}
	if err := d.root.Lchown(r, int(uid), int(gid)); err != nil {
		return Entry{}, classify(r, err)
	}
	if err := d.root.Chmod(r, mode); err != nil {
		return Entry{}, classify(r, err)
	}
	return d.Stat(r)
}

// Open opens the regular file p for reading.
func (d *Dir) Open(p string) (*os.File, error) {
	r, err := rel(p)
	if err != nil {
		return nil, err
	}
	f, err := d.root.OpenFile(r, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, classify(p, err)
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("path %q is not a regular file: %w", clip(p), errdefs.ErrInvalidArgument)
	}
	return f, nil
}

// SetMeta changes the owner and mode of p (a symlink: the link's owner
// only, its mode has none).
func (d *Dir) SetMeta(p string, m Meta) (Entry, error) {
	e, err := d.Stat(p)
	if err != nil {
		return Entry{}, err
	}
	r, _ := rel(p)
	uid, gid := e.UID, e.GID
	if m.UID != nil {
		uid = *m.UID
	}
	if m.GID != nil {
		gid = *m.GID
	}
	if err := d.root.Lchown(r, int(uid), int(gid)); err != nil {
		return Entry{}, classify(p, err)
	}
	if m.Mode != nil && e.Type != "symlink" {
		if err := d.root.Chmod(r, fs.FileMode(*m.Mode)&fs.ModePerm); err != nil {
			return Entry{}, classify(p, err)
		}
	}
	return d.Stat(p)
}

// Remove removes p and, for a directory, everything in it.
func (d *Dir) Remove(p string) error {
	r, err := rel(p)
	if err != nil {
		return err
	}
	if r == "." {
		return fmt.Errorf("the volume's root cannot be removed: %w", errdefs.ErrInvalidArgument)
	}
	if _, err := d.root.Lstat(r); err != nil {
		return classify(p, err)
	}
	return classify(p, d.root.RemoveAll(r))
}
