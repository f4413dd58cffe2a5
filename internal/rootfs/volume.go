package rootfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// Volumes (internal/volume) reuse the layer's machinery: a persistent
// volume is an ext4 image, dir/disk.img, loop-mounted on dir/data; the
// image size caps what the volume holds. Unmount(dir) tears one down.

// volumeDataName is the mount point of a volume's image under its dir.
const volumeDataName = "data"

// VolumeData is where the volume under dir is mounted.
func VolumeData(dir string) string { return filepath.Join(dir, volumeDataName) }

// MakeVolume creates dir with a sparse ext4 image of size bytes whose root
// directory is owned by uid:gid, and mounts it (see MountVolume). Unlike a
// layer's, the image has a journal: a volume's data must survive a crash
// of the host. On failure dir is removed.
func MakeVolume(ctx context.Context, dir string, size int64, uid, gid int) (err error) {
	if size < MinSize {
		return fmt.Errorf("volume size %d below %d: %w", size, MinSize, errdefs.ErrInvalidArgument)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("creating volume dir: %w", err)
	}
	defer func() {
		if err != nil {
			_ = Unmount(context.WithoutCancel(ctx), dir)
		}
	}()
	image := filepath.Join(dir, imageName)
	if err := sparseFile(image, size); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-m", "0",
		"-E", fmt.Sprintf("lazy_itable_init=1,nodiscard,root_owner=%d:%d", uid, gid), image)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("formatting volume image: %w: %s", err, strings.TrimSpace(string(out)))
	}
	if err := MountVolume(dir); err != nil {
		return err
	}
	// mkfs's lost+found would show in every listing; e2fsck remakes it
	// if it needs it.
	if err := os.Remove(filepath.Join(VolumeData(dir), "lost+found")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("preparing volume: %w", err)
	}
	return nil
}

// MountVolume mounts the image of the volume under dir on VolumeData(dir)
// unless it is mounted already (after a restart of kiln serve it still
// is; after a reboot it is not).
func MountVolume(dir string) error {
	data := VolumeData(dir)
	mounts, err := mountsUnder(data)
	if err != nil {
		return err
	}
	if len(mounts) > 0 {
		return nil
	}
	if err := os.Mkdir(data, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("creating volume mount point: %w", err)
	}
	dev, err := attachLoop(filepath.Join(dir, imageName))
	if err != nil {
		return err
	}
	defer dev.Close() // the mount holds the device (see mountImage)
	// The host reads what sandboxes wrote (the volume content API): no
	// device nodes, no set-uid bits.
	if err := unix.Mount(dev.Name(), data, "ext4", unix.MS_NOATIME|unix.MS_NODEV|unix.MS_NOSUID, ""); err != nil {
		return fmt.Errorf("mounting volume image: %w", err)
	}
	return nil
}
