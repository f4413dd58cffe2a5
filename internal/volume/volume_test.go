package volume_test

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/oci/ocitest"
	"github.com/kiln-sh/kiln/internal/rootfs"
	"github.com/kiln-sh/kiln/internal/store/sqlite"
	"github.com/kiln-sh/kiln/internal/volume"
)

// newManager is a Manager on a real SQLite store and real ext4 images in
// a temp dir (root: loop devices), with quota per key.
func newManager(t *testing.T, quota int64) (*volume.Manager, *sqlite.Store, string) {
	t.Helper()
	ocitest.RequireRoot(t)
	dir := t.TempDir()
	st, err := sqlite.Open(t.Context(), filepath.Join(dir, "kiln.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	vdir := filepath.Join(dir, "volumes")
	m, err := volume.New(volume.Config{Dir: vdir, Store: st, Quota: quota})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		entries, _ := os.ReadDir(vdir)
		for _, e := range entries {
			if err := rootfs.Unmount(context.Background(), filepath.Join(vdir, e.Name())); err != nil {
				t.Errorf("removing volume %s: %v", e.Name(), err)
			}
		}
	})
	return m, st, vdir
}

// TestFilesStayInside checks the content API against what a sandbox can
// leave in a volume: symlinks out of it (absolute, relative, through a
// directory), a FIFO, and paths with dot-dots. None may reach the host's
// files; the host mount has no device nodes or set-uid bits.
func TestFilesStayInside(t *testing.T) {
	m, _, _ := newManager(t, 1<<30)
	ctx := t.Context()
	v, err := m.Create(ctx, "key", "vol", 32<<20)
	if err != nil {
		t.Fatal(err)
	}
	_, data, err := m.Data(ctx, "key", "vol")
	if err != nil {
		t.Fatal(err)
	}
	// What a sandbox could have made in the volume.
	hostDir := t.TempDir()
	secret := filepath.Join(hostDir, "secret")
	for _, f := range []string{secret, filepath.Join(hostDir, "passwd")} {
		if err := os.WriteFile(f, []byte("host secret"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for name, target := range map[string]string{"abs": secret, "rel": "../../../../../../../" + secret, "etc": hostDir} {
		if err := os.Symlink(target, filepath.Join(data, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := syscall.Mkfifo(filepath.Join(data, "fifo"), 0o666); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(data); err != nil || fi.Sys().(*syscall.Stat_t).Uid != volume.OwnerUID {
		t.Errorf("volume root: %v, want owned by %d", err, volume.OwnerUID)
	}

	d, err := m.Open(ctx, v.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for _, p := range []string{"/abs", "rel", "/etc/passwd", "/../../etc/passwd", "fifo"} {
		if f, err := d.Open(p); err == nil {
			b, _ := io.ReadAll(f)
			f.Close()
			t.Errorf("read %s: got %q", p, b)
		}
		if _, err := d.WriteFile(p, strings.NewReader("x"), volume.Meta{}); err == nil {
			t.Errorf("wrote %s", p)
		}
		if _, err := d.SetMeta(p+"/x", volume.Meta{}); err == nil {
			t.Errorf("chowned %s/x", p)
		}
	}
	// "/../../etc/passwd" is the volume's own etc/passwd: the path is
	// cleaned against the volume's root, never the host's; and etc is a
	// symlink out of it.
	for _, f := range []string{secret, filepath.Join(hostDir, "passwd")} {
		if b, _ := os.ReadFile(f); string(b) != "host secret" {
			t.Errorf("the host file %s now holds %q", f, b)
		}
	}
	if _, err := d.Stat("/etc/passwd"); !errors.Is(err, errdefs.ErrInvalidArgument) && !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("stat through a symlink out: %v", err)
	}
	e, err := d.Stat("/abs")
	if err != nil || e.Type != "symlink" || e.Target != secret {
		t.Errorf("stat of a symlink: %+v, %v", e, err)
	}
	if err := d.Remove("/abs"); err != nil {
		t.Errorf("removing the symlink: %v", err)
	}
	if _, err := os.Stat(secret); err != nil {
		t.Errorf("removing a symlink removed its target: %v", err)
	}
	if err := d.Remove("/"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("removing the root: %v", err)
	}

	// Files and directories the API makes belong to the sandbox's user.
	if _, err := d.WriteFile("/a/b/c.txt", strings.NewReader("hello"), volume.Meta{}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"a", "a/b", "a/b/c.txt"} {
		fi, err := os.Lstat(filepath.Join(data, p))
		if err != nil || fi.Sys().(*syscall.Stat_t).Uid != volume.OwnerUID {
			t.Errorf("%s: %v, want owned by %d", p, err, volume.OwnerUID)
		}
	}
	es, err := d.List("/", 3)
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, e := range es {
		paths = append(paths, e.Path)
	}
	if !strings.Contains(strings.Join(paths, " "), "/a/b/c.txt") {
		t.Errorf("listing to depth 3: %q", paths)
	}
	// The host mount: no set-uid bits, no device nodes.
	var sfs syscall.Statfs_t
	if err := syscall.Statfs(data, &sfs); err != nil || sfs.Flags&(syscall.MS_NOSUID|syscall.MS_NODEV) != syscall.MS_NOSUID|syscall.MS_NODEV {
		t.Errorf("host mount flags %#x, %v: want nosuid and nodev", sfs.Flags, err)
	}
}

// TestQuotaAndRecords checks the size cap (ENOSPC past it), the quota per
// key, names per key and deleting.
func TestQuotaAndRecords(t *testing.T) {
	m, _, vdir := newManager(t, 64<<20)
	ctx := t.Context()
	a, err := m.Create(ctx, "key-a", "a", 32<<20)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Create(ctx, "key-a", "a", 16<<20); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("same name again: %v", err)
	}
	if _, err := m.Create(ctx, "key-b", "a", 16<<20); err != nil {
		t.Errorf("same name, other key: %v", err)
	}
	if _, err := m.Create(ctx, "key-a", "b", 48<<20); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("past the key's quota: %v", err)
	}
	if _, err := m.Get(ctx, "key-b", a.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another key's volume: %v", err)
	}
	d, err := m.Open(ctx, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	_, err = d.WriteFile("big", io.LimitReader(zeros{}, 40<<20), volume.Meta{})
	d.Close()
	if !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("writing past the volume's size: %v", err)
	}
	if err := m.Delete(ctx, "key-a", "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(vdir, a.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("deleted volume's dir: %v", err)
	}
	if _, err := m.Create(ctx, "key-a", "b", 48<<20); err != nil {
		t.Errorf("after a delete the quota is free again: %v", err)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }
