package layer

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// TestCapture mounts an overlay over a lower layer, changes it the ways a
// RUN step does (writes, deletes, a replaced directory, owners, modes,
// links, xattrs, a FIFO, a sparse file), captures the upper dir, mounts
// the captured layer over the same lower and compares the two merged
// trees, excluded paths aside.
func TestCapture(t *testing.T) {
	requireRoot(t)
	lower, upper, work, merged := tempDir(t), tempDir(t), tempDir(t), tempDir(t)
	makeTree(t, lower, []fsEntry{
		{path: "etc/conf", content: "v1"},
		{path: "del.txt", content: "gone soon"},
		{path: "data/dir/a", content: "a"},
		{path: "opq/x", content: "x"},
		{path: "opq/sub/y", content: "y"},
		{path: "tmp", kind: "dir", mode: 0o1777},
		{path: "usr/bin/tool", content: "t", mode: 0o755},
	})
	if err := unix.Mount("overlay", merged, "overlay", 0, "lowerdir="+lower+",upperdir="+upper+",workdir="+work); err != nil {
		t.Fatalf("mounting overlay: %v", err)
	}
	mounted := true
	defer func() {
		if mounted {
			unix.Unmount(merged, unix.MNT_DETACH)
		}
	}()
	m := func(p string) string { return filepath.Join(merged, p) }
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(m("new.txt"), []byte("new"), 0o644))
	must(os.Chown(m("new.txt"), 1234, 5678))
	must(os.Chmod(m("new.txt"), 0o755|os.ModeSetuid))
	must(unix.Setxattr(m("new.txt"), "user.note", []byte("hello"), 0))
	must(os.Link(m("new.txt"), m("hl.txt")))
	must(os.Symlink("/etc/passwd", m("sl")))
	must(unix.Mkfifo(m("fifo"), 0o600))
	must(os.WriteFile(m("etc/conf"), []byte("v2"), 0o600))
	must(os.Chtimes(m("etc/conf"), time.Unix(1600000000, 0), time.Unix(1600000000, 123456789)))
	must(os.Remove(m("del.txt")))
	must(os.RemoveAll(m("opq")))
	must(os.MkdirAll(m("opq/z"), 0o700))
	must(os.Chown(m("usr/bin"), 0, 50))
	f, err := os.Create(m("sparse"))
	must(err)
	_, err = f.WriteAt([]byte{1}, 10<<20)
	must(err)
	must(f.Close())
	must(os.WriteFile(m("tmp/junk"), []byte("j"), 0o644))
	must(os.WriteFile(m("etc/resolv.conf"), []byte("nameserver 1.1.1.1"), 0o644))
	must(os.Symlink("/", m("root-link"))) // a link Capture must not follow

	want := snapshot(t, merged, true)
	delete(want, "/tmp/junk")
	delete(want, "/etc/resolv.conf")
	// Excluding a file changes nothing about its directory as captured.
	must(unix.Unmount(merged, 0))
	mounted = false

	out := tempDir(t)
	err = Capture(context.Background(), out, upper, CaptureParams{Exclude: []string{"/tmp/*", "/etc/resolv.conf"}})
	if err != nil {
		t.Fatalf("Capture: %v", err)
	}
	got := snapshot(t, mountOverlay(t, out, lower), true)
	// A directory's mtime in the merged view of the original mount is the
	// upper's; /etc and /tmp gained then lost an excluded entry, so
	// their captured mtimes are the upper's too: compare everything.
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("merged tree after capture differs (-before +after):\n%s", diff)
	}
	var a, b unix.Stat_t
	must(unix.Lstat(filepath.Join(out, "new.txt"), &a))
	must(unix.Lstat(filepath.Join(out, "hl.txt"), &b))
	if a.Ino != b.Ino || a.Nlink != 2 {
		t.Errorf("hard link not kept: inodes %d, %d, nlink %d", a.Ino, b.Ino, a.Nlink)
	}
	if v, err := getXattr(filepath.Join(out, "opq"), opaqueXattr); err != nil || v != "y" {
		t.Errorf("opq not opaque in the layer: %q, %v", v, err)
	}
	must(unix.Lstat(filepath.Join(out, "del.txt"), &a))
	if !isWhiteout(&a) {
		t.Errorf("del.txt is not a whiteout in the layer: mode %o", a.Mode)
	}
	for _, p := range []string{"tmp/junk", "etc/resolv.conf"} {
		if _, err := os.Lstat(filepath.Join(out, p)); err == nil {
			t.Errorf("excluded %s captured", p)
		}
	}

	t.Run("limit", func(t *testing.T) {
		err := Capture(context.Background(), tempDir(t), upper, CaptureParams{Limit: 1 << 20})
		if !errors.Is(err, errdefs.ErrResourceExhausted) {
			t.Errorf("Capture over the limit = %v", err)
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := Capture(ctx, tempDir(t), upper, CaptureParams{}); !errors.Is(err, context.Canceled) {
			t.Errorf("Capture with a cancelled ctx = %v", err)
		}
	})
	t.Run("bad exclude", func(t *testing.T) {
		err := Capture(context.Background(), tempDir(t), upper, CaptureParams{Exclude: []string{"tmp/["}})
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "exclude") {
			t.Errorf("Capture with a bad pattern = %v", err)
		}
	})
}

// TestCaptureRedirect refuses an upper whose data lives below (overlayfs
// metacopy or redirect_dir), which a copy of the upper would lose.
func TestCaptureRedirect(t *testing.T) {
	requireRoot(t)
	upper := tempDir(t)
	makeTree(t, upper, []fsEntry{{path: "moved", kind: "dir"}})
	if err := unix.Setxattr(filepath.Join(upper, "moved"), "trusted.overlay.redirect", []byte("/orig"), 0); err != nil {
		t.Fatal(err)
	}
	err := Capture(context.Background(), tempDir(t), upper, CaptureParams{})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Capture of a redirected dir = %v", err)
	}
}
