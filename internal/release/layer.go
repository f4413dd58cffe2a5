package release

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// dirTar writes the overlay layer dir as an OCI layer tar to w: whiteouts
// (character devices 0:0) become .wh.<name> entries, directories marked
// opaque (trusted.overlay.opaque=y) get a .wh..wh..opq entry, files that
// share an inode become hard links, and xattrs other than overlay's own
// are kept (security.capability of ping, say). Entries are in path order
// with their own owners, modes and times, so the same dir gives the same
// tar.
func dirTar(ctx context.Context, dir string, w io.Writer) error {
	tw := tar.NewWriter(w)
	links := map[[2]uint64]string{} // dev, inode → first path
	var walk func(rel string) error
	walk = func(rel string) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		names, err := readDirNames(filepath.Join(dir, rel))
		if err != nil {
			return err
		}
		for _, name := range names {
			p := filepath.Join(rel, name)
			full := filepath.Join(dir, p)
			var st unix.Stat_t
			if err := unix.Lstat(full, &st); err != nil {
				return fmt.Errorf("reading %s: %w", p, err)
			}
			if st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0 {
				h := &tar.Header{Typeflag: tar.TypeReg, Name: filepath.Join(rel, ".wh."+name), Mode: 0o644,
					ModTime: mtime(&st), Format: tar.FormatPAX}
				if err := tw.WriteHeader(h); err != nil {
					return fmt.Errorf("writing whiteout %s: %w", p, err)
				}
				continue
			}
			h, err := header(full, p, &st)
			if err != nil {
				return err
			}
			if h == nil { // a socket: not part of an image
				continue
			}
			key := [2]uint64{st.Dev, st.Ino}
			if h.Typeflag == tar.TypeReg && st.Nlink > 1 {
				if first, ok := links[key]; ok {
					h.Typeflag, h.Linkname, h.Size = tar.TypeLink, first, 0
				} else {
					links[key] = p
				}
			}
			if err := tw.WriteHeader(h); err != nil {
				return fmt.Errorf("writing %s: %w", p, err)
			}
			switch h.Typeflag {
			case tar.TypeReg:
				if err := copyFile(tw, full, h.Size); err != nil {
					return fmt.Errorf("writing %s: %w", p, err)
				}
			case tar.TypeDir:
				if opaque(full) {
					oh := &tar.Header{Typeflag: tar.TypeReg, Name: filepath.Join(p, ".wh..wh..opq"), Mode: 0o644,
						ModTime: h.ModTime, Format: tar.FormatPAX}
					if err := tw.WriteHeader(oh); err != nil {
						return fmt.Errorf("writing opaque marker of %s: %w", p, err)
					}
				}
				if err := walk(p); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(""); err != nil {
		return err
	}
	return tw.Close()
}

// header is the tar header of the entry at full (rel inside the layer),
// nil for a socket.
func header(full, rel string, st *unix.Stat_t) (*tar.Header, error) {
	h := &tar.Header{Name: rel, Mode: int64(st.Mode & 0o7777), Uid: int(st.Uid), Gid: int(st.Gid),
		ModTime: mtime(st), Format: tar.FormatPAX}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		h.Typeflag, h.Size = tar.TypeReg, st.Size
	case unix.S_IFDIR:
		h.Typeflag, h.Name = tar.TypeDir, rel+"/"
	case unix.S_IFLNK:
		target, err := os.Readlink(full)
		if err != nil {
			return nil, fmt.Errorf("reading link %s: %w", rel, err)
		}
		h.Typeflag, h.Linkname = tar.TypeSymlink, target
	case unix.S_IFCHR, unix.S_IFBLK:
		h.Typeflag = tar.TypeChar
		if st.Mode&unix.S_IFMT == unix.S_IFBLK {
			h.Typeflag = tar.TypeBlock
		}
		h.Devmajor, h.Devminor = int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
	case unix.S_IFIFO:
		h.Typeflag = tar.TypeFifo
	default:
		return nil, nil
	}
	if st.Mode&unix.S_IFMT != unix.S_IFLNK {
		xs, err := xattrs(full)
		if err != nil {
			return nil, fmt.Errorf("reading xattrs of %s: %w", rel, err)
		}
		for k, v := range xs {
			if h.PAXRecords == nil {
				h.PAXRecords = map[string]string{}
			}
			h.PAXRecords["SCHILY.xattr."+k] = v
		}
	}
	return h, nil
}

// xattrs are the entry's extended attributes but overlay's own.
func xattrs(p string) (map[string]string, error) {
	buf := make([]byte, 4096)
	n, err := unix.Llistxattr(p, buf)
	if err != nil {
		if err == unix.ENOTSUP {
			return nil, nil
		}
		return nil, err
	}
	var out map[string]string
	for _, k := range strings.Split(string(buf[:n]), "\x00") {
		if k == "" || strings.HasPrefix(k, "trusted.overlay.") {
			continue
		}
		v := make([]byte, 4096)
		m, err := unix.Lgetxattr(p, k, v)
		if err != nil {
			return nil, err
		}
		if out == nil {
			out = map[string]string{}
		}
		out[k] = string(v[:m])
	}
	return out, nil
}

// opaque says whether the overlay dir p hides the layers below it.
func opaque(p string) bool {
	v := make([]byte, 8)
	n, err := unix.Lgetxattr(p, "trusted.overlay.opaque", v)
	return err == nil && string(v[:n]) == "y"
}

func mtime(st *unix.Stat_t) time.Time {
	return time.Unix(st.Mtim.Sec, st.Mtim.Nsec).UTC()
}

func readDirNames(dir string) ([]string, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", dir, err)
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", dir, err)
	}
	sort.Strings(names)
	return names, nil
}

// copyFile copies exactly size bytes of the file at p: a file that
// changed size meanwhile fails the layer rather than corrupting it.
func copyFile(w io.Writer, p string, size int64) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := io.Copy(w, io.LimitReader(f, size))
	if err != nil {
		return err
	}
	if n != size {
		return fmt.Errorf("%s: %w (it shrank while being read)", p, io.ErrUnexpectedEOF)
	}
	return nil
}

// fileEntry is one file that the kiln layer adds to the image.
type fileEntry struct {
	src  string // host path
	dst  string // path in the image, without the leading /
	mode int64
}

// filesTar writes the kiln layer: the parent directories of the files
// (root's, 0755) and the files themselves, all owned by root, with the
// fixed time t so that the same binaries give the same layer.
func filesTar(files []fileEntry, t time.Time, w io.Writer) error {
	tw := tar.NewWriter(w)
	dirs := map[string]bool{}
	for _, f := range files {
		var parents []string
		for d := filepath.Dir(f.dst); d != "." && d != "/"; d = filepath.Dir(d) {
			parents = append([]string{d}, parents...)
		}
		for _, d := range parents {
			if dirs[d] {
				continue
			}
			dirs[d] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: t, Format: tar.FormatPAX}); err != nil {
				return err
			}
		}
		fi, err := os.Stat(f.src)
		if err != nil {
			return fmt.Errorf("reading %s: %w", f.src, err)
		}
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("%s: not a regular file: %w", f.src, fs.ErrInvalid)
		}
		h := &tar.Header{Typeflag: tar.TypeReg, Name: f.dst, Mode: f.mode, Size: fi.Size(), ModTime: t, Format: tar.FormatPAX}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if err := copyFile(tw, f.src, fi.Size()); err != nil {
			return fmt.Errorf("writing %s: %w", f.dst, err)
		}
	}
	return tw.Close()
}
