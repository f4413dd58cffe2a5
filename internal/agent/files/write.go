package files

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kiln-sh/kiln/api"
)

// defaultMode is the permission of a new file when none is given.
const defaultMode = 0o644

// WriteOptions say how Write writes.
type WriteOptions struct {
	Mode   uint32 // permission bits; 0: the replaced file's, or 0644
	Append bool
	// InPlace truncates and rewrites the file itself (no temporary file).
	InPlace bool
	// XattrPrefix, if set, replaces the file's extended attributes under
	// it with Xattrs (names relative to the prefix).
	XattrPrefix string
	Xattrs      map[string]string
}

// Write writes the contents of r to path as the user, creating missing
// parents (0755, owned by the user), and returns the file's description.
//
// Replacing writes a temporary file in the same directory and renames it
// over path, so readers never see a half-written file and a failed write
// (e.g. a full disk) leaves the old contents. Root keeps a replaced file's
// owner. If the user may write the file but not its directory, it is
// rewritten in place instead. Appending, and InPlace, write in place. A
// symlink at path is followed, so its target is written.
func (s *Service) Write(ctx context.Context, u User, path string, o WriteOptions, r io.Reader) (api.FileInfo, error) {
	p, err := Resolve(u, path)
	if err != nil {
		return api.FileInfo{}, err
	}
	if strings.HasSuffix(path, "/") {
		return api.FileInfo{}, apiErrorf(api.CodeInvalidArgument, "writing %s: a path ending in / names a directory, not a file", p)
	}
	if o.XattrPrefix != "" {
		if err := checkXattrs(o.XattrPrefix, o.Xattrs); err != nil {
			return api.FileInfo{}, err
		}
	}
	var (
		f      *os.File
		target = p
		temp   string // "" when writing in place
	)
	err = asUser(u, func() error {
		if t, err := filepath.EvalSymlinks(p); err == nil {
			target = t
		}
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		var err error
		f, temp, err = openForWrite(target, o)
		return err
	})
	if err != nil {
		return api.FileInfo{}, classify("writing", p, err)
	}
	_, err = io.Copy(f, ctxReader{ctx, r})
	if err == nil && o.XattrPrefix != "" {
		err = setXattrs(f, o.XattrPrefix, o.Xattrs)
	}
	if err == nil {
		// An acknowledged upload is on the sandbox's disk: a disk that
		// cannot take it (the layer's, or the host's under it) fails
		// here, not later in writeback where the data would be lost.
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && temp != "" {
		err = asUser(u, func() error { return os.Rename(temp, target) })
	}
	if err != nil {
		if temp != "" {
			os.Remove(temp)
		}
		return api.FileInfo{}, classify("writing", p, err)
	}
	var info api.FileInfo
	err = asUser(u, func() error {
		fi, err := os.Stat(target)
		if err == nil {
			info = fileInfo(p, fi, loadNames())
			if o.XattrPrefix != "" && len(o.Xattrs) > 0 {
				info.Xattrs = o.Xattrs
			}
		}
		return err
	})
	return info, classify("writing", p, err)
}

// openForWrite opens target for writing: a temporary file beside it, or
// target itself (appending, or when its directory is not writable).
func openForWrite(target string, o WriteOptions) (f *os.File, temp string, err error) {
	old, err := os.Stat(target)
	switch {
	case err == nil && old.IsDir():
		return nil, "", apiErrorf(api.CodeInvalidArgument, "writing %s: is a directory", target)
	case err == nil && !old.Mode().IsRegular():
		return nil, "", notRegular("writing", target, old)
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return nil, "", err
	}
	exists := err == nil
	mode := fs.FileMode(o.Mode).Perm()
	if mode == 0 {
		mode = defaultMode
		if exists {
			mode = old.Mode().Perm()
		}
	}
	if o.Append || o.InPlace {
		flag := os.O_APPEND
		if !o.Append {
			flag = os.O_TRUNC
		}
		f, err = openRegular(target, os.O_WRONLY|os.O_CREATE|flag, mode)
		if err == nil && !exists {
			err = f.Chmod(mode) // beat the umask
		}
		return f, "", err
	}
	f, err = os.CreateTemp(filepath.Dir(target), "."+filepath.Base(target)+".kiln-*")
	if errors.Is(err, fs.ErrPermission) && exists {
		f, err = openRegular(target, os.O_WRONLY|os.O_TRUNC, 0)
		return f, "", err
	}
	if err != nil {
		return nil, "", err
	}
	err = f.Chmod(mode)
	if st, ok := sysStat(old); ok && err == nil && os.Geteuid() == 0 {
		err = f.Chown(int(st.Uid), int(st.Gid))
	}
	if err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, "", err
	}
	return f, f.Name(), nil
}

// openRegular opens a file to write in place without blocking (a FIFO
// that replaced it since the caller's stat has no reader to wait for),
// and refuses anything but a regular file.
func openRegular(name string, flag int, mode fs.FileMode) (*os.File, error) {
	f, err := os.OpenFile(name, flag|unix.O_NONBLOCK, mode)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = notRegular("writing", name, fi)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// sysStat returns the raw stat of fi, if there is one.
func sysStat(fi fs.FileInfo) (*syscall.Stat_t, bool) {
	if fi == nil {
		return nil, false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return st, ok
}

// ctxReader stops reading once ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(b []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(b)
}
