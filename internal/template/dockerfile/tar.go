package dockerfile

import (
	"archive/tar"
	"compress/gzip"
	"fmt"
	"io"
	"io/fs"
	"syscall"
	"time"
)

// WriteTar writes the gzipped tar of what the source pattern src takes,
// as E2B's SDK uploads it for a COPY step: each file, directory and link
// under its path relative to the context root (the root itself left out),
// in FilesHash's order, links not followed, modes kept. Owners are 0 and
// times the Unix epoch, so the same files always give the same bytes.
func (c *Context) WriteTar(w io.Writer, src string) error {
	files, err := c.match(src)
	if err != nil {
		return err
	}
	zw := gzip.NewWriter(w)
	tw := tar.NewWriter(zw)
	for _, e := range files {
		if e.rel == "." {
			continue
		}
		if err := c.writeEntry(tw, e); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("writing build context tar: %w", err)
	}
	if err := zw.Close(); err != nil {
		return fmt.Errorf("writing build context tar: %w", err)
	}
	return nil
}

func (c *Context) writeEntry(tw *tar.Writer, e entry) error {
	mode := int64(e.info.Mode().Perm())
	if st, ok := e.info.Sys().(*syscall.Stat_t); ok {
		mode = int64(st.Mode & 0o7777) // with setuid, setgid, sticky
	}
	hdr := &tar.Header{Name: e.rel, Mode: mode, ModTime: time.Unix(0, 0)}
	switch m := e.info.Mode(); {
	case m.IsDir():
		hdr.Typeflag, hdr.Name = tar.TypeDir, e.rel+"/"
	case m&fs.ModeSymlink != 0:
		target, err := c.root.Readlink(e.rel)
		if err != nil {
			return fmt.Errorf("build context: %w", err)
		}
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
	default:
		hdr.Typeflag, hdr.Size = tar.TypeReg, e.info.Size()
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("writing build context tar: %w", err)
	}
	if hdr.Typeflag == tar.TypeReg {
		return c.copyFile(tw, e)
	}
	return nil
}
