package rootfs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("test needs root (mounts, loop devices); CI=true so not skipping")
	}
	t.Skip("test needs root (mounts, loop devices)")
}

// lowerDir makes a small template tree.
func lowerDir(t testing.TB) string {
	t.Helper()
	lower := filepath.Join(t.TempDir(), "lower")
	if err := os.MkdirAll(filepath.Join(lower, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(lower, "etc", "hostname"), []byte("template\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return lower
}

func mount(t testing.TB, lower string, size int64) *Layer {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "sb")
	l, err := Mount(context.Background(), lower, dir, size)
	if err != nil {
		t.Fatalf("Mount: %v", err)
	}
	t.Cleanup(func() { _ = Unmount(context.Background(), dir) })
	return l
}

// assertGone checks that nothing of dir is left: mounts, loops, files.
func assertGone(t *testing.T, dir string) {
	t.Helper()
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(mi, []byte(dir)) {
		t.Errorf("mount under %s left in mountinfo", dir)
	}
	// A mount namespace another process (a sandbox, ip netns) copied
	// while the layer was mounted keeps the loop device until it is
	// released; the device clears itself (autoclear) then. Wait for that.
	var out []byte
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		out, err = exec.Command("losetup", "-a").CombinedOutput()
		if err != nil {
			t.Fatalf("losetup -a: %v: %s", err, out)
		}
		if !strings.Contains(string(out), dir) || time.Now().After(deadline) {
			break
		}
	}
	if strings.Contains(string(out), dir) {
		t.Errorf("loop device left for %s: %s", dir, out)
	}
	if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("dir %s left: %v", dir, err)
	}
}

func TestMountUnmount(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	lower := lowerDir(t)
	l := mount(t, lower, 64<<20)

	got, err := os.ReadFile(filepath.Join(l.Rootfs(), "etc", "hostname"))
	if err != nil || string(got) != "template\n" {
		t.Fatalf("reading lower file through overlay: %q, %v", got, err)
	}
	if err := os.WriteFile(filepath.Join(l.Rootfs(), "etc", "hostname"), []byte("sandbox\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(l.Rootfs(), "new"), make([]byte, 4<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(lower, "etc", "hostname")); string(got) != "template\n" {
		t.Errorf("lower modified: %q", got)
	}
	if _, err := os.Stat(filepath.Join(lower, "new")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("new file leaked into lower: %v", err)
	}
	used, total, err := Usage(l.Dir())
	if err != nil {
		t.Fatalf("Usage: %v", err)
	}
	if used < 4<<20 || total > 64<<20 || total < 48<<20 {
		t.Errorf("Usage = %d/%d, want used >= 4 MiB, total about 64 MiB", used, total)
	}

	if err := Unmount(context.Background(), l.Dir()); err != nil {
		t.Fatalf("Unmount: %v", err)
	}
	assertGone(t, l.Dir())
	if err := Unmount(context.Background(), l.Dir()); err != nil {
		t.Errorf("second Unmount: %v", err)
	}
	if _, _, err := Usage(l.Dir()); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Usage after Unmount = %v, want ErrNotFound", err)
	}
}

func TestENOSPC(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	const size = 32 << 20
	l := mount(t, lowerDir(t), size)

	f, err := os.Create(filepath.Join(l.Rootfs(), "fill"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	var werr error
	for i := 0; i < 2*size/len(buf) && werr == nil; i++ {
		_, werr = f.Write(buf)
	}
	if werr == nil {
		werr = f.Sync()
	}
	if !errors.Is(werr, syscall.ENOSPC) {
		t.Fatalf("filling layer: got %v, want ENOSPC", werr)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(l.Dir(), imageName), &st); err != nil {
		t.Fatal(err)
	}
	if alloc := st.Blocks * 512; alloc > size {
		t.Errorf("image allocates %d bytes on host, more than its size %d", alloc, size)
	}
}

func TestMountFailureUnwinds(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	// A comma in lowerdir breaks the overlay options: failure after the
	// image is formatted and loop-mounted.
	lower := filepath.Join(t.TempDir(), "a,b")
	if err := os.Mkdir(lower, 0o755); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "sb")
	if _, err := Mount(context.Background(), lower, dir, 32<<20); err == nil {
		t.Fatal("Mount succeeded with a bad lowerdir")
	}
	assertGone(t, dir)
}

func TestUnmountPartial(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	// As after a crash between steps: image mounted, no overlay.
	dir, image := imageDir(t)
	if err := mountImage(image, filepath.Join(dir, layerName)); err != nil {
		t.Fatal(err)
	}
	if err := Unmount(context.Background(), dir); err != nil {
		t.Fatalf("Unmount: %v", err)
	}
	assertGone(t, dir)
}

func TestMountInvalid(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	lower := lowerDir(t)
	dir := filepath.Join(t.TempDir(), "sb")
	if _, err := Mount(context.Background(), lower, dir, 1<<20); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("tiny size: got %v, want ErrInvalidArgument", err)
	}
	l := mount(t, lower, 32<<20)
	if _, err := Mount(context.Background(), lower, l.Dir(), 32<<20); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("existing dir: got %v, want ErrAlreadyExists", err)
	}
	if _, err := os.Stat(l.Rootfs()); err != nil {
		t.Errorf("failed Mount on an existing dir touched it: %v", err)
	}
}

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		`/a/b`:         "/a/b",
		`/a\040b`:      "/a b",
		`/x\134y`:      `/x\y`,
		`/trailing\04`: `/trailing\04`,
	} {
		if got := unescape(in); got != want {
			t.Errorf("unescape(%q) = %q, want %q", in, got, want)
		}
	}
}

func BenchmarkMount(b *testing.B) {
	requireRoot(b)
	lower := lowerDir(b)
	base := b.TempDir()
	ctx := context.Background()
	for i := 0; b.Loop(); i++ {
		dir := filepath.Join(base, "sb")
		if _, err := Mount(ctx, lower, dir, 1<<30); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := Unmount(ctx, dir); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

// Remount brings back a layer whose mounts were lost (a reboot) with its
// files, over one lower dir or a stack of them; it refuses a layer still
// mounted or whose lower dir (any of the stack) is gone, and leaves no
// mount behind when it fails.
func TestRemount(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	for _, stacked := range []bool{false, true} {
		t.Run(fmt.Sprintf("stacked=%v", stacked), func(t *testing.T) {
			bottom := lowerDir(t)
			lower := bottom
			if stacked {
				top := t.TempDir()
				if err := os.WriteFile(filepath.Join(top, "top"), []byte("top\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				lower = top + ":" + bottom
			}
			l := mount(t, lower, 64<<20)
			if err := os.WriteFile(filepath.Join(l.Rootfs(), "kept"), []byte("kept\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := Remount(l.Dir()); !errors.Is(err, errdefs.ErrFailedPrecondition) {
				t.Errorf("Remount of a mounted layer: %v, want ErrFailedPrecondition", err)
			}
			lose := func() {
				t.Helper()
				for _, m := range []string{l.Rootfs(), filepath.Join(l.Dir(), layerName)} {
					if err := unix.Unmount(m, 0); err != nil {
						t.Fatalf("unmounting %s: %v", m, err)
					}
				}
			}
			lose()
			r, err := Remount(l.Dir())
			if err != nil {
				t.Fatalf("Remount: %v", err)
			}
			want := map[string]string{"kept": "kept\n", "etc/hostname": "template\n"}
			if stacked {
				want["top"] = "top\n"
			}
			for name, want := range want {
				if got, err := os.ReadFile(filepath.Join(r.Rootfs(), name)); err != nil || string(got) != want {
					t.Errorf("%s after Remount: %q, %v", name, got, err)
				}
			}

			lose()
			if err := os.Rename(bottom, bottom+".moved"); err != nil {
				t.Fatal(err)
			}
			if _, err := Remount(l.Dir()); !errors.Is(err, errdefs.ErrFailedPrecondition) {
				t.Errorf("Remount without its lower dir: %v, want ErrFailedPrecondition", err)
			}
			if mounts, err := mountsUnder(l.Dir()); err != nil || len(mounts) != 0 {
				t.Errorf("failed Remount left mounts %v (%v)", mounts, err)
			}
			if err := Unmount(context.Background(), l.Dir()); err != nil {
				t.Fatalf("Unmount: %v", err)
			}
			assertGone(t, l.Dir())
		})
	}
}

// The loop devices a layer was mounted from are found through mountinfo
// (not by reading every loop device's backing file); an image left on a
// loop device without a mount (no autoclear: as an older build, or a
// hand's losetup, leaves it) is still found by the scan and detached.
func TestUnmountFindsLoops(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	l := mount(t, lowerDir(t), 32<<20)
	loops := loopSourcesUnder(l.Dir())
	if len(loops) != 1 || backingFile(loops[0]) != filepath.Join(l.Dir(), imageName) {
		t.Fatalf("mounted loop devices %v (backing %q); want the layer image's one", loops, backingFile(loops[0]))
	}
	if err := Unmount(context.Background(), l.Dir()); err != nil {
		t.Fatal(err)
	}
	assertGone(t, l.Dir())

	dir, image := imageDir(t)
	if out, err := exec.Command("losetup", "-f", image).CombinedOutput(); err != nil {
		t.Fatalf("losetup: %v: %s", err, out)
	}
	if err := Unmount(context.Background(), dir); err != nil {
		t.Fatalf("Unmount: %v", err)
	}
	assertGone(t, dir)
}

// imageDir makes a sandbox dir holding a 32 MiB layer image, nothing
// mounted.
func imageDir(t *testing.T) (dir, image string) {
	t.Helper()
	dir = filepath.Join(t.TempDir(), "sb")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	image = filepath.Join(dir, imageName)
	if err := makeImage(context.Background(), image, 32<<20); err != nil {
		t.Fatal(err)
	}
	return dir, image
}

// Writes counts what reaches a layer's image: nothing while nothing is
// written, more after a write and a Sync. A copy of the image has the
// same data (SameData), until the layer changes.
func TestWritesAndSameData(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	l := mount(t, lowerDir(t), 64<<20)
	t.Cleanup(func() { _ = Unmount(context.Background(), l.Dir()) })
	if err := Sync(l.Dir()); err != nil {
		t.Fatal(err)
	}
	w0, err := Writes(l.Dir())
	if err != nil {
		t.Fatalf("Writes: %v", err)
	}
	cp := filepath.Join(t.TempDir(), "copy.img")
	if err := CopySparse(cp, ImagePath(l.Dir())); err != nil {
		t.Fatal(err)
	}
	if err := Sync(l.Dir()); err != nil {
		t.Fatal(err)
	}
	if w, err := Writes(l.Dir()); err != nil || w != w0 {
		t.Errorf("Writes after a sync with nothing written = %d, %v; was %d", w, err, w0)
	}
	if same, err := SameData(ImagePath(l.Dir()), cp); err != nil || !same {
		t.Errorf("SameData of an image and its copy = %v, %v", same, err)
	}
	if err := os.WriteFile(filepath.Join(l.Rootfs(), "new"), []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Sync(l.Dir()); err != nil {
		t.Fatal(err)
	}
	if w, err := Writes(l.Dir()); err != nil || w <= w0 {
		t.Errorf("Writes after a write = %d, %v; was %d", w, err, w0)
	}
	if same, err := SameData(ImagePath(l.Dir()), cp); err != nil || same {
		t.Errorf("SameData after a write = %v, %v", same, err)
	}
	if _, err := Writes(t.TempDir()); err == nil {
		t.Error("Writes of a dir with no layer succeeded")
	}
}
