package image

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"

	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"golang.org/x/sys/unix"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// UnpackOptions bound an unpack.
type UnpackOptions struct {
	// MaxBytes bounds the layer's size twice: its uncompressed tar
	// stream, and what it writes (file contents plus 512 bytes for each
	// entry). Beyond it the unpack fails with ErrResourceExhausted. 0: no
	// limit.
	MaxBytes int64
	// Log gets warnings about entries left out (devices, sockets,
	// overlayfs's own xattrs). nil: slog.Default().
	Log *slog.Logger
}

// errLimit is what the reader returns past MaxBytes.
var errLimit = errors.New("layer over the size limit")

// Unpack writes the layer into the directory dst in the overlay layer
// format (see the package doc): dst must not exist, or be an empty
// directory; its parent must exist and be on the filesystem the layer
// is to live on. It returns the bytes written (file contents plus 512 per
// entry). The layer is unpacked into a temporary directory beside dst and
// renamed to dst once complete and checked against its Key, so dst is
// never partial: after an error it is as before and nothing else is left.
// ctx cancels the unpack, including a download in progress. Needs root
// (owners, whiteout devices, trusted xattrs).
func (l Layer) Unpack(ctx context.Context, dst string, o UnpackOptions) (int64, error) {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".unpack-")
	if err != nil {
		return 0, fmt.Errorf("creating the directory of layer %s: %w", l.Key, sysErr(err))
	}
	n, err := l.unpackInto(ctx, tmp, o)
	if err == nil {
		// rename(2), not os.Rename, which refuses to replace an empty
		// directory.
		if err = unix.Rename(tmp, dst); errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST) || errors.Is(err, unix.ENOTDIR) {
			err = fmt.Errorf("layer %s: its destination exists and is not an empty directory: %w", l.Key, errdefs.ErrAlreadyExists)
		} else if err != nil {
			err = fmt.Errorf("publishing layer %s: %w", l.Key, sysErr(err))
		}
	}
	if err != nil {
		os.RemoveAll(tmp)
		return 0, err
	}
	return n, nil
}

// unpackInto unpacks the layer into the empty directory dir and checks
// its content against the layer's key.
func (l Layer) unpackInto(ctx context.Context, dir string, o UnpackOptions) (int64, error) {
	rc, err := l.l.Uncompressed()
	if err != nil {
		return 0, l.readError(ctx, err)
	}
	defer rc.Close()
	// Closing the stream is what stops a read blocked on the network.
	defer context.AfterFunc(ctx, func() { rc.Close() })()
	h := sha256.New()
	cr := &countingReader{r: rc, h: h, max: o.MaxBytes}

	b, err := openBeneath(dir)
	if err != nil {
		return 0, fmt.Errorf("opening the directory of layer %s: %w", l.Key, sysErr(err))
	}
	defer b.close()
	u := &unpacker{b: b, log: o.Log.With("layer", l.Key), max: o.MaxBytes}
	if err := u.run(ctx, tar.NewReader(cr)); err != nil {
		return 0, l.entryError(ctx, cr, err)
	}
	// The diffID covers the whole stream, past the tar's end marker.
	if _, err := io.Copy(io.Discard, cr); err != nil {
		return 0, l.entryError(ctx, cr, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != l.Key {
		return 0, fmt.Errorf("layer %s of image %s: its content has digest sha256:%s, not the one its image names: %w", l.Key, errdefs.Clip(l.image), got, errdefs.ErrInvalidArgument)
	}
	if err := u.finish(); err != nil {
		return 0, fmt.Errorf("layer %s: %w", l.Key, sysErr(err))
	}
	if err := syncfs(b); err != nil {
		return 0, fmt.Errorf("syncing layer %s: %w", l.Key, sysErr(err))
	}
	return u.used, nil
}

// entryError classifies a failure of the unpack loop.
func (l Layer) entryError(ctx context.Context, cr *countingReader, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("unpacking layer %s: %w", l.Key, cerr)
	}
	switch {
	case errors.Is(err, errLimit):
		return fmt.Errorf("layer %s of image %s is larger than the limit of %d bytes: %w", l.Key, errdefs.Clip(l.image), cr.max, errdefs.ErrResourceExhausted)
	case cr.err != nil && !errors.Is(cr.err, io.EOF):
		return l.readError(ctx, cr.err)
	case errors.Is(err, errdefs.ErrInvalidArgument):
		return fmt.Errorf("layer %s of image %s: %w", l.Key, errdefs.Clip(l.image), err)
	case errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT):
		return fmt.Errorf("unpacking layer %s: %w: %w", l.Key, err, errdefs.ErrResourceExhausted)
	case errors.Is(err, tar.ErrHeader) || errors.Is(err, tar.ErrFieldTooLong) || errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("layer %s of image %s is not a valid tar: %w", l.Key, errdefs.Clip(l.image), errdefs.ErrInvalidArgument)
	}
	// Entry errors name paths inside the layer only (the calls are
	// relative to the layer's directory), never the host's.
	return fmt.Errorf("unpacking layer %s: %w", l.Key, err)
}

// readError classifies a failure to read the layer's stream: a network
// failure, or content that does not decompress.
func (l Layer) readError(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("unpacking layer %s: %w", l.Key, cerr)
	}
	var te *transport.Error
	if cause := networkCause(err); cause != "" || errors.As(err, &te) {
		if cause == "" {
			cause = fmt.Sprintf("status %d", te.StatusCode)
		}
		return fmt.Errorf("downloading layer %s of image %s: %s: %w", l.Key, errdefs.Clip(l.image), cause, errdefs.ErrUnavailable)
	}
	return fmt.Errorf("reading layer %s of image %s: %s: %w", l.Key, errdefs.Clip(l.image), errdefs.ClipN(err.Error(), 200), errdefs.ErrInvalidArgument)
}

// countingReader hashes and counts the uncompressed stream, stops it past
// max and remembers its own error (to tell the network from the tar).
type countingReader struct {
	r   io.Reader
	h   hash.Hash
	n   int64
	max int64
	err error
}

func (c *countingReader) Read(p []byte) (int, error) {
	if c.max > 0 && c.n > c.max {
		return 0, errLimit
	}
	n, err := c.r.Read(p)
	c.h.Write(p[:n])
	c.n += int64(n)
	if err != nil {
		c.err = err
	}
	if c.max > 0 && c.n > c.max {
		return n, errLimit
	}
	return n, err
}

// sysErr keeps the errno of a filesystem error and drops the host path it
// names; other errors pass unchanged.
func sysErr(err error) error {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno
	}
	var pe *os.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s: %w", pe.Op, pe.Err)
	}
	return err
}

// syncfs flushes the filesystem the layer is on, so a published layer is
// on disk before its rename.
func syncfs(b beneath) error {
	fd, err := b.open(".", unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Syncfs(fd)
}
