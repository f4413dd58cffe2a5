// Package rootfs builds the per-sandbox writable layer: a sparse ext4 image,
// loop-mounted, carrying the upper and work dirs of an overlay whose lower
// dir is the read-only template rootfs. The image size caps the sandbox's
// disk use: filling it gives ENOSPC inside and costs nothing outside.
//
// Layout under dir:
//
//	disk.img         sparse ext4 image
//	lower            the path of the lower dir (for Remount)
//	layer/           its mount point (upper/, work/)
//	rootfs/          the overlay mount, the sandbox's root filesystem
package rootfs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

const (
	imageName  = "disk.img"
	lowerName  = "lower"
	layerName  = "layer"
	rootfsName = "rootfs"

	// MinSize is the smallest layer accepted; ext4 needs room for metadata.
	MinSize = 16 << 20
)

// Layer is a mounted writable layer.
type Layer struct {
	dir string
}

// Dir is the directory holding the layer.
func (l *Layer) Dir() string { return l.dir }

// Rootfs is the overlay mount point to use as the bundle's root.
func (l *Layer) Rootfs() string { return filepath.Join(l.dir, rootfsName) }

// Mount creates dir and mounts a writable layer of size bytes over lower.
// On failure everything made so far is unwound.
func Mount(ctx context.Context, lower, dir string, size int64) (*Layer, error) {
	if size < MinSize {
		return nil, fmt.Errorf("layer size %d below %d: %w", size, MinSize, errdefs.ErrInvalidArgument)
	}
	return mountLayer(ctx, lower, dir, true, func(img string) error { return makeImage(ctx, img, size) })
}

// mountLayer makes dir, creates its layer image with makeImg, loop-mounts it
// and mounts the overlay over lower. A fresh image gets new upper and work
// dirs; a copied one must already have them. On failure everything made so
// far is unwound.
func mountLayer(ctx context.Context, lower, dir string, fresh bool, makeImg func(image string) error) (l *Layer, err error) {
	dir, err = filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("resolving dir: %w", err)
	}
	// lower is one dir, or a stack of them top first joined by ':' (a
	// custom template's layers).
	for _, low := range strings.Split(lower, ":") {
		if fi, err := os.Stat(low); err != nil {
			return nil, fmt.Errorf("checking lower dir: %w", err)
		} else if !fi.IsDir() {
			return nil, fmt.Errorf("lower %s is not a directory: %w", low, errdefs.ErrInvalidArgument)
		}
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("creating layer dir: %w", errdefs.ErrAlreadyExists)
		}
		return nil, fmt.Errorf("creating layer dir: %w", err)
	}
	defer func() {
		if err != nil {
			// Detached: unwinding must finish even if ctx is what failed us.
			_ = Unmount(context.WithoutCancel(ctx), dir)
		}
	}()

	if err := os.WriteFile(filepath.Join(dir, lowerName), []byte(lower), 0o600); err != nil {
		return nil, fmt.Errorf("recording lower dir: %w", err)
	}
	if err := makeImg(filepath.Join(dir, imageName)); err != nil {
		return nil, err
	}
	if err := mountParts(lower, dir, fresh); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("mounting layer: %w", err)
	}
	return &Layer{dir: dir}, nil
}

// Upper is the overlay upper dir of the layer under dir: what the sandbox
// wrote to its root filesystem.
func Upper(dir string) string { return filepath.Join(dir, layerName, "upper") }

// mountParts loop-mounts dir's image on its layer dir and mounts the
// overlay over lower on its rootfs dir, making the mount points if they
// are missing. A fresh image gets new upper and work dirs.
func mountParts(lower, dir string, fresh bool) error {
	layer := filepath.Join(dir, layerName)
	if err := mountImage(filepath.Join(dir, imageName), layer); err != nil {
		return err
	}
	upper, work := Upper(dir), filepath.Join(layer, "work")
	for _, d := range []string{upper, work} {
		if fresh {
			if err := os.Mkdir(d, 0o755); err != nil {
				return fmt.Errorf("creating %s: %w", filepath.Base(d), err)
			}
		} else if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			return fmt.Errorf("layer image has no %s dir: %w", filepath.Base(d), errdefs.ErrInvalidArgument)
		}
	}
	root := filepath.Join(dir, rootfsName)
	if err := os.Mkdir(root, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("creating rootfs dir: %w", err)
	}
	opts := "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work
	if err := unix.Mount("overlay", root, "overlay", 0, opts); err != nil {
		return fmt.Errorf("mounting overlay: %w", err)
	}
	return nil
}

// Remount mounts the layer under dir again, as Mount or MountImage made
// it, after its mounts were lost while its files were kept (a reboot of
// the host). The lower dir must still be where it was. On failure the
// mounts it made are undone; the files stay.
func Remount(dir string) (_ *Layer, err error) {
	dir, err = filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("resolving dir: %w", err)
	}
	b, err := os.ReadFile(filepath.Join(dir, lowerName))
	if err != nil {
		return nil, fmt.Errorf("reading the layer's lower dir: %w", err)
	}
	lower := string(b)
	for _, low := range strings.Split(lower, ":") { // one dir, or a stack
		if fi, err := os.Stat(low); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("the layer's lower dir %s is gone: %w", low, errdefs.ErrFailedPrecondition)
		}
	}
	if left, err := mountsUnder(dir); err != nil {
		return nil, err
	} else if len(left) > 0 {
		return nil, fmt.Errorf("layer %s is still mounted: %w", dir, errdefs.ErrFailedPrecondition)
	}
	if err := mountParts(lower, dir, false); err != nil {
		mounts, _ := mountsUnder(dir)
		for _, m := range mounts { // deepest first
			_ = unix.Unmount(m, unix.MNT_DETACH)
		}
		return nil, err
	}
	return &Layer{dir: dir}, nil
}

// makeImage creates a sparse ext4 image: no journal (the layer is scratch
// space, thrown away on crash) and no reserved blocks, so size is what the
// sandbox gets.
func makeImage(ctx context.Context, image string, size int64) error {
	if err := sparseFile(image, size); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-m", "0",
		"-O", "^has_journal", "-E", "lazy_itable_init=1,nodiscard", image)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("formatting image: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// sparseFile creates image, a new sparse file of size bytes.
func sparseFile(image string, size int64) error {
	f, err := os.OpenFile(image, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("creating image: %w", err)
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sizing image: %w", err)
	}
	return nil
}

func mountImage(image, target string) error {
	if err := os.Mkdir(target, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("creating layer mount point: %w", err)
	}
	dev, err := attachLoop(image)
	if err != nil {
		return err
	}
	// After the mount succeeds the mount holds the device; closing ours lets
	// autoclear detach it on unmount. On failure closing detaches it now.
	defer dev.Close()
	// noinit_itable: no background zeroing of the inode tables mkfs left
	// uninitialised (lazy_itable_init). ext4 knows which inodes are unused
	// without it; the zeroing would write to every new layer for minutes,
	// which Fork takes for a change under its checkpoint (see Writes).
	if err := unix.Mount(dev.Name(), target, "ext4", unix.MS_NOATIME, "noinit_itable"); err != nil {
		return fmt.Errorf("mounting image: %w", err)
	}
	return nil
}

// Unmount tears down whatever Mount left under dir, even partially or after
// a crash: every mount at or below dir (deepest first), every loop device
// backed by dir's image, then dir itself. A missing dir is not an error.
func Unmount(ctx context.Context, dir string) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("resolving dir: %w", err)
	}
	if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	mounts, err := mountsUnder(dir)
	if err != nil {
		return err
	}
	image := filepath.Join(dir, imageName)
	mountedLoops := loopSourcesUnder(dir)
	var errs []error
	for _, m := range mounts { // deepest first
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("unmounting layer: %w", err)
		}
		if err := unix.Unmount(m, 0); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			// Busy: detach lazily so the tree goes away once released.
			if err2 := unix.Unmount(m, unix.MNT_DETACH); err2 != nil && !errors.Is(err2, unix.EINVAL) {
				errs = append(errs, fmt.Errorf("unmounting %s: %w", m, err))
			}
		}
	}
	var devs []string
	if len(mountedLoops) > 0 {
		// The image was mounted from these: only they are looked at
		// (autoclear has detached them unless a mount elsewhere still
		// holds one). Reading every loop device's backing file grows
		// with the sandboxes on the host (~80 ms a kill with 1,000).
		for _, d := range mountedLoops {
			if backingFile(d) == image {
				devs = append(devs, d)
			}
		}
	} else if devs, err = loopsFor(image); err != nil { // after a crash: any device
		errs = append(errs, fmt.Errorf("listing loop devices: %w", err))
	}
	for _, d := range devs {
		if err := detachLoop(d); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	// Never RemoveAll through a live mount: it would write whiteouts or
	// worse, delete files of whatever is still mounted there.
	if left, err := mountsUnder(dir); err != nil {
		return err
	} else if len(left) > 0 {
		return fmt.Errorf("removing layer dir: still mounted: %s: %w", strings.Join(left, ", "), errdefs.ErrFailedPrecondition)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("removing layer dir: %w", err)
	}
	return nil
}

// Usage reports the bytes used and available in total on the layer.
func Usage(dir string) (used, total int64, err error) {
	layer := filepath.Join(dir, layerName)
	var st, parent unix.Stat_t
	if err := unix.Stat(layer, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return 0, 0, fmt.Errorf("statting layer: %w", errdefs.ErrNotFound)
		}
		return 0, 0, fmt.Errorf("statting layer: %w", err)
	}
	if err := unix.Stat(dir, &parent); err != nil {
		return 0, 0, fmt.Errorf("statting layer dir: %w", err)
	}
	if st.Dev == parent.Dev {
		return 0, 0, fmt.Errorf("layer not mounted: %w", errdefs.ErrNotFound)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(layer, &fs); err != nil {
		return 0, 0, fmt.Errorf("statting layer fs: %w", err)
	}
	bs := int64(fs.Bsize)
	return int64(fs.Blocks-fs.Bfree) * bs, int64(fs.Blocks) * bs, nil
}

// mountsUnder lists mount points at or below dir, deepest (latest) first.
func mountsUnder(dir string) ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("reading mountinfo: %w", err)
	}
	var out []string
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := unescape(f[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	// mountinfo lists in mount order; children come after their parents.
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out, nil
}

// loopSourcesUnder lists the loop devices (e.g. /dev/loop3) mounted at
// or below dir, from mountinfo.
func loopSourcesUnder(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		sep := slices.Index(f, "-")
		if len(f) < 5 || sep < 0 || sep+2 >= len(f) {
			continue
		}
		mp, src := unescape(f[4]), f[sep+2]
		if (mp == dir || strings.HasPrefix(mp, dir+"/")) && strings.HasPrefix(src, "/dev/loop") && !slices.Contains(out, src) {
			out = append(out, src)
		}
	}
	return out
}

// unescape decodes mountinfo's octal escapes (\040 for space etc.).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// ImagePath is the path of the layer image under dir (see Mount).
func ImagePath(dir string) string { return filepath.Join(dir, imageName) }

// Sync flushes the layer under dir (its ext4 filesystem, and with it the
// image file's contents) to disk, so that a copy of the image taken while
// nothing writes to the layer is consistent.
func Sync(dir string) error {
	f, err := os.Open(filepath.Join(dir, layerName))
	if err != nil {
		return fmt.Errorf("opening layer: %w", err)
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("syncing layer: %w", err)
	}
	return nil
}

// Writes counts the sectors written to the layer image under dir (as for
// Mount) so far, by its loop device. The same count before and after a
// Sync says the image did not change in between, so a copy taken at the
// first still matches it. (The loop device's count of write requests
// would not do: every syncfs adds a flush to it, with no sectors.)
func Writes(dir string) (uint64, error) {
	abs, err := filepath.Abs(filepath.Join(dir, layerName))
	if err != nil {
		return 0, fmt.Errorf("resolving layer: %w", err)
	}
	var dev string
	for _, src := range loopSourcesUnder(abs) {
		if dev != "" {
			return 0, fmt.Errorf("layer %s has more than one loop device", abs)
		}
		dev = src
	}
	if dev == "" {
		return 0, fmt.Errorf("layer %s is not loop-mounted", abs)
	}
	// /sys/block/<dev>/stat: the seventh field is the sectors written.
	b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "stat"))
	if err != nil {
		return 0, fmt.Errorf("reading loop device stats: %w", err)
	}
	f := strings.Fields(string(b))
	if len(f) < 7 {
		return 0, fmt.Errorf("loop device stats %q: %w", b, errdefs.ErrInvalidArgument)
	}
	n, err := strconv.ParseUint(f[6], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("loop device stats: %w", err)
	}
	return n, nil
}

// MountImage is Mount with the layer image taken from a copy of image
// (e.g. of another sandbox's layer, see CopySparse) instead of a new one:
// its upper and work dirs carry that layer's files. image itself is not
// changed. On failure everything made so far is unwound.
func MountImage(ctx context.Context, lower, dir, image string) (*Layer, error) {
	return mountLayer(ctx, lower, dir, false, func(img string) error {
		if err := CopySparse(img, image); err != nil {
			return fmt.Errorf("copying layer image: %w", err)
		}
		return nil
	})
}

// CopySparse copies src to a new file dst, keeping src's holes: only the
// data extents (SEEK_DATA/SEEK_HOLE) are copied, with copy_file_range. A
// failed copy removes dst.
func CopySparse(dst, src string) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(dst)
		}
	}()
	size := fi.Size()
	if err := out.Truncate(size); err != nil {
		return err
	}
	ifd, ofd := int(in.Fd()), int(out.Fd())
	extents, err := dataExtents(ifd, size)
	if err != nil {
		return err
	}
	for _, e := range extents {
		for roff, woff := e[0], e[0]; roff < e[1]; {
			n, err := unix.CopyFileRange(ifd, &roff, ofd, &woff, int(min(e[1]-roff, 1<<30)), 0)
			if err != nil {
				return fmt.Errorf("copying: %w", err)
			}
			if n == 0 {
				return fmt.Errorf("copying: %s shrank", src)
			}
		}
	}
	return nil
}

// dataExtents lists the [start, end) ranges of the file fd (of size
// bytes) that hold data; the rest are holes.
func dataExtents(fd int, size int64) ([][2]int64, error) {
	var out [][2]int64
	for off := int64(0); off < size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) { // only a hole is left
			break
		} else if err != nil {
			return nil, fmt.Errorf("seeking data: %w", err)
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return nil, fmt.Errorf("seeking hole: %w", err)
		}
		out = append(out, [2]int64{data, hole})
		off = hole
	}
	return out, nil
}

// SameData reports whether the files a and b (e.g. a layer image and a
// CopySparse of it) have the same size, the same data extents and the
// same bytes in them; only the data extents are read.
func SameData(a, b string) (bool, error) {
	fa, err := os.Open(a)
	if err != nil {
		return false, err
	}
	defer fa.Close()
	fb, err := os.Open(b)
	if err != nil {
		return false, err
	}
	defer fb.Close()
	sa, err := fa.Stat()
	if err != nil {
		return false, err
	}
	sb, err := fb.Stat()
	if err != nil {
		return false, err
	}
	if sa.Size() != sb.Size() {
		return false, nil
	}
	ea, err := dataExtents(int(fa.Fd()), sa.Size())
	if err != nil {
		return false, err
	}
	eb, err := dataExtents(int(fb.Fd()), sb.Size())
	if err != nil {
		return false, err
	}
	if !slices.Equal(ea, eb) {
		return false, nil
	}
	bufA, bufB := make([]byte, 1<<20), make([]byte, 1<<20)
	for _, e := range ea {
		for off := e[0]; off < e[1]; {
			n := int(min(e[1]-off, int64(len(bufA))))
			if _, err := fa.ReadAt(bufA[:n], off); err != nil {
				return false, fmt.Errorf("reading %s: %w", filepath.Base(a), err)
			}
			if _, err := fb.ReadAt(bufB[:n], off); err != nil {
				return false, fmt.Errorf("reading %s: %w", filepath.Base(b), err)
			}
			if !bytes.Equal(bufA[:n], bufB[:n]) {
				return false, nil
			}
			off += int64(n)
		}
	}
	return true, nil
}

// Syncer tells whether what was written to a layer reached the host's
// disk. A sandbox's own fsync may not report that the host disk under its
// image is full: under gVisor the error can land on a host descriptor the
// sentry does not ask. syncfs on the layer's file system reports every
// writeback error since the Syncer was made.
type Syncer struct{ f *os.File }

// NewSyncer watches the layer of dir (as for Mount) from now on.
func NewSyncer(dir string) (*Syncer, error) {
	f, err := os.Open(filepath.Join(dir, layerName))
	if err != nil {
		return nil, fmt.Errorf("opening layer: %w", err)
	}
	return &Syncer{f}, nil
}

// Sync writes the layer's dirty data to the host's disk and reports any
// failure to store it since the Syncer was made.
func (s *Syncer) Sync() error {
	if err := unix.Syncfs(int(s.f.Fd())); err != nil {
		return fmt.Errorf("syncing layer: %w", err)
	}
	return nil
}

// Close releases the Syncer.
func (s *Syncer) Close() error { return s.f.Close() }
