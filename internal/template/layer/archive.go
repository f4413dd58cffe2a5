package layer

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/bzip2"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// compression is how an archive is compressed, told from its first bytes.
type compression int

const (
	plain compression = iota
	gzipped
	bzipped
	xzipped
)

func sniff(br *bufio.Reader) compression {
	head, _ := br.Peek(6)
	switch {
	case bytes.HasPrefix(head, []byte{0x1f, 0x8b}):
		return gzipped
	case bytes.HasPrefix(head, []byte("BZh")):
		return bzipped
	case bytes.HasPrefix(head, []byte{0xfd, '7', 'z', 'X', 'Z', 0}):
		return xzipped
	}
	return plain
}

// errNoXZ is returned for an xz archive on a host without the xz tool.
var errNoXZ = fmt.Errorf("xz archives need the xz tool on the build host: %w", errdefs.ErrFailedPrecondition)

// decompress returns the decompressed stream of r (gzip, bzip2, xz via the
// xz binary, or as is) and a function that releases it and reports a
// decompressor's failure.
func decompress(ctx context.Context, r io.Reader) (io.Reader, func() error, error) {
	br := bufio.NewReader(r)
	switch sniff(br) {
	case gzipped:
		z, err := gzip.NewReader(br)
		if err != nil {
			return nil, nil, fmt.Errorf("reading gzip: %w: %w", err, errdefs.ErrInvalidArgument)
		}
		return z, z.Close, nil
	case bzipped:
		return bzip2.NewReader(br), func() error { return nil }, nil
	case xzipped:
		bin, err := exec.LookPath("xz")
		if err != nil {
			return nil, nil, errNoXZ
		}
		cmd := exec.CommandContext(ctx, bin, "-dc")
		cmd.Stdin = br
		out, err := cmd.StdoutPipe()
		if err != nil {
			return nil, nil, err
		}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			return nil, nil, fmt.Errorf("starting xz: %w", err)
		}
		return out, func() error {
			_, _ = io.Copy(io.Discard, out)
			if err := cmd.Wait(); err != nil {
				return fmt.Errorf("xz: %s: %w", errdefs.ClipN(stderr.String(), 200), errdefs.ErrInvalidArgument)
			}
			return nil
		}, nil
	}
	return br, func() error { return nil }, nil
}

// isTar reports whether r starts with a tar header (ustar or GNU magic).
func isTar(br *bufio.Reader) bool {
	head, err := br.Peek(263)
	if err != nil {
		return false
	}
	return bytes.Equal(head[257:262], []byte("ustar"))
}

// untar writes the entries of the tar stream r into t, each passed through
// fix first (which may rename it, change its owner or mode, or drop it by
// returning false). Names are made relative and must stay inside the tree.
// The caller calls t.finish when the tree is complete.
func untar(ctx context.Context, t *tree, r io.Reader, fix func(h *tar.Header) bool) error {
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		h, err := tr.Next()
		if errors.Is(err, tar.ErrInsecurePath) {
			err = nil // cleanRel below is the judge
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("reading tar: %w: %w", err, errdefs.ErrInvalidArgument)
		}
		if h.Name, err = cleanRel(h.Name); err != nil {
			return err
		}
		if h.Typeflag == tar.TypeLink {
			if h.Linkname, err = cleanRel(h.Linkname); err != nil {
				return err
			}
		}
		if fix != nil && !fix(h) {
			continue
		}
		if err := t.put(h, tr); err != nil {
			return err
		}
	}
	return nil
}
