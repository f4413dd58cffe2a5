package release

import (
	"archive/tar"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

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
