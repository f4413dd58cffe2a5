package layer

import (
	"archive/tar"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// CaptureParams are the options of Capture.
type CaptureParams struct {
	// Exclude are path.Match patterns on absolute paths as the sandbox
	// sees them ("/tmp/*", "/etc/resolv.conf"): a matching entry, and
	// everything under it, is left out.
	Exclude []string
	// Limit is the most bytes of file content captured (0: no limit);
	// over it Capture fails with ErrResourceExhausted.
	Limit int64
	Log   *slog.Logger
}

// Capture copies the overlayfs upper dir of a stopped build sandbox into
// the empty layer directory dir, keeping the layer format: whiteouts,
// opaque directories, owners, modes, times, extended attributes, hard
// links and FIFOs (sparse files are written dense; sockets and device
// nodes other than whiteouts are skipped with a warning). Overlayfs's
// other bookkeeping attributes are dropped, and an upper dir that relies
// on metacopy or redirect_dir (whose data lives in the layers below) is
// refused with ErrFailedPrecondition. upper is untrusted: it is read
// without following symlinks and nothing is written outside dir. On error
// dir holds a partial layer; discard it.
func Capture(ctx context.Context, dir, upper string, p CaptureParams) error {
	for _, pat := range p.Exclude {
		if _, err := path.Match(pat, ""); err != nil || !strings.HasPrefix(pat, "/") {
			return fmt.Errorf("exclude pattern %q: %w", errdefs.Clip(pat), errdefs.ErrInvalidArgument)
		}
	}
	src, err := os.OpenFile(upper, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("opening upper dir: %w", err)
	}
	defer src.Close()
	dst, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("opening layer dir: %w", err)
	}
	defer dst.Close()
	c := &capturer{
		t:       &tree{root: dst, limit: p.Limit, xattr: captureXattr, log: p.Log},
		exclude: p.Exclude,
		links:   map[[2]uint64]string{},
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(src.Fd()), &st); err != nil {
		return fmt.Errorf("reading upper dir: %w", err)
	}
	rootHdr, err := header(src, "", ".", &st)
	if err != nil {
		return err
	}
	if err := c.walk(ctx, src, ""); err != nil {
		return fmt.Errorf("capturing the build's changes: %w", err)
	}
	if err := c.t.finish(); err != nil {
		return err
	}
	return c.t.setMeta(dst, "", rootHdr)
}

type capturer struct {
	t       *tree
	exclude []string
	links   map[[2]uint64]string // (dev, inode) → first path captured
}

// captureXattr keeps every attribute but overlayfs's bookkeeping, except
// the opaque mark of a directory.
func captureXattr(k, v string) bool {
	if k == opaqueXattr {
		return v == "y"
	}
	return !strings.HasPrefix(k, "trusted.overlay.")
}

func (c *capturer) excluded(p string) bool {
	for _, pat := range c.exclude {
		if ok, _ := path.Match(pat, p); ok {
			return true
		}
	}
	return false
}

func (c *capturer) walk(ctx context.Context, d *os.File, rel string) error {
	names, err := d.Readdirnames(-1)
	if err != nil {
		return err
	}
	sort.Strings(names)
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return err
		}
		r := path.Join(rel, name)
		if c.excluded("/" + r) {
			continue
		}
		st, err := lstatAt(d, name)
		if err != nil {
			return err
		}
		h, err := header(d, name, r, &st)
		if err != nil {
			return err
		}
		for _, k := range []string{"trusted.overlay.metacopy", "trusted.overlay.redirect"} {
			if _, ok := h.PAXRecords[paxXattr+k]; ok {
				return fmt.Errorf("%s has %s (overlay metacopy/redirect_dir must be off): %w", errdefs.Clip("/"+r), k, errdefs.ErrFailedPrecondition)
			}
		}
		switch h.Typeflag {
		case tar.TypeReg:
			err = c.file(d, name, h, &st)
		case tar.TypeDir:
			if err = c.t.put(h, nil); err == nil {
				err = c.dir(ctx, d, name, r)
			}
		default:
			err = c.t.put(h, nil)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (c *capturer) dir(ctx context.Context, d *os.File, name, rel string) error {
	sub, err := openDir(d, name)
	if err != nil {
		return err
	}
	defer sub.Close()
	return c.walk(ctx, sub, rel)
}

// file captures a regular file, as a hard link to an earlier path of the
// same inode when there is one.
func (c *capturer) file(d *os.File, name string, h *tar.Header, st *unix.Stat_t) error {
	id := [2]uint64{st.Dev, st.Ino}
	if st.Nlink > 1 {
		if first, ok := c.links[id]; ok {
			h.Typeflag, h.Linkname, h.Size = tar.TypeLink, first, 0
			return c.t.put(h, nil)
		}
		c.links[id] = h.Name
	}
	// O_NONBLOCK: a FIFO swapped in since the stat must not block the open.
	f, err := openBeneath(d, name, unix.O_RDONLY|unix.O_NONBLOCK)
	if err != nil {
		return err
	}
	defer f.Close()
	var now unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &now); err != nil {
		return err
	}
	if now.Ino != st.Ino || now.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("%s changed while being captured: %w", errdefs.Clip("/"+h.Name), errdefs.ErrFailedPrecondition)
	}
	return c.t.put(h, f)
}
