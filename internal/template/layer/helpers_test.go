package layer

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kiln-sh/kiln/internal/oci/ocitest"
)

// fsEntry is one entry of a test tree (a lower layer or a build context).
type fsEntry struct {
	path    string
	kind    string // "file" (default), "dir", "symlink", "link", "whiteout", "opaque"
	content string // file content, or the target of a symlink/link
	mode    int64  // 0: 0644 for files, 0755 for dirs
	uid     int
	gid     int
}

// makeTree writes entries under dir, parents 0755 root.
func makeTree(t *testing.T, dir string, entries []fsEntry) {
	t.Helper()
	for _, e := range entries {
		p := filepath.Join(dir, e.path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		switch e.kind {
		case "dir", "opaque":
			err = os.Mkdir(p, 0o755)
			if err == nil && e.kind == "opaque" {
				err = unix.Setxattr(p, opaqueXattr, []byte("y"), 0)
			}
		case "symlink":
			err = os.Symlink(e.content, p)
		case "link":
			err = os.Link(filepath.Join(dir, e.content), p)
		case "whiteout":
			err = unix.Mknod(p, unix.S_IFCHR, 0)
		default:
			err = os.WriteFile(p, []byte(e.content), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
		if e.kind == "link" {
			continue
		}
		if err := os.Lchown(p, e.uid, e.gid); err != nil {
			t.Fatal(err)
		}
		if e.mode != 0 && e.kind != "symlink" {
			if err := os.Chmod(p, fs.FileMode(e.mode&0o777)|modeBits(e.mode)); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func modeBits(m int64) fs.FileMode {
	var out fs.FileMode
	if m&0o4000 != 0 {
		out |= fs.ModeSetuid
	}
	if m&0o2000 != 0 {
		out |= fs.ModeSetgid
	}
	if m&0o1000 != 0 {
		out |= fs.ModeSticky
	}
	return out
}

// tarOf makes a tar (gzipped if gz) of entries, as a build context upload.
func tarOf(t *testing.T, gz bool, entries []fsEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mt := time.Unix(1700000000, 0)
	for _, e := range entries {
		h := &tar.Header{Name: e.path, Mode: e.mode, Uid: e.uid, Gid: e.gid, ModTime: mt}
		switch e.kind {
		case "dir":
			h.Typeflag = tar.TypeDir
			if h.Mode == 0 {
				h.Mode = 0o755
			}
		case "symlink":
			h.Typeflag, h.Linkname = tar.TypeSymlink, e.content
		case "link":
			h.Typeflag, h.Linkname = tar.TypeLink, e.content
		case "whiteout":
			h.Typeflag = tar.TypeChar
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.content))
			if h.Mode == 0 {
				h.Mode = 0o644
			}
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(e.content))
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if !gz {
		return buf.Bytes()
	}
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	zw.Write(buf.Bytes())
	zw.Close()
	return z.Bytes()
}

// mountOverlay mounts a read-only overlay of lowers (top first) and
// returns its mount point, unmounted when the test ends.
func mountOverlay(t *testing.T, lowers ...string) string {
	t.Helper()
	if len(lowers) == 1 { // overlayfs wants two lowers without an upper
		lowers = append(lowers, tempDir(t))
	}
	merged := tempDir(t)
	if err := unix.Mount("overlay", merged, "overlay", unix.MS_RDONLY, "lowerdir="+strings.Join(lowers, ":")); err != nil {
		t.Fatalf("mounting overlay: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(merged, unix.MNT_DETACH) })
	return merged
}

// node is what a test sees of one path of a tree.
type seen struct {
	Kind    string
	Mode    uint32
	UID     int
	GID     int
	Content string // file content (hash when large) or link target
	Mtime   int64
	Xattrs  string
}

// snapshot describes every path under root (not following symlinks).
func snapshot(t *testing.T, root string, mtimes bool) map[string]seen {
	t.Helper()
	out := map[string]seen{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		s := seen{Mode: st.Mode & 0o7777, UID: int(st.Uid), GID: int(st.Gid)}
		if mtimes {
			s.Mtime = st.Mtim.Nano()
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			s.Kind = "dir"
		case unix.S_IFREG:
			s.Kind = "file"
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			s.Content = string(b)
			if len(b) > 256 {
				sum := sha256.Sum256(b)
				s.Content = hex.EncodeToString(sum[:])
			}
		case unix.S_IFLNK:
			s.Kind = "symlink"
			s.Content, _ = os.Readlink(p)
		case unix.S_IFIFO:
			s.Kind = "fifo"
		case unix.S_IFCHR:
			s.Kind = "chardev"
		default:
			s.Kind = "other"
		}
		if x := xattrsOf(p); x != "" {
			s.Xattrs = x
		}
		out[filepath.Join("/", rel)] = s
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// xattrsOf lists p's user.* and security.* attributes as k=v lines.
func xattrsOf(p string) string {
	buf := make([]byte, 4096)
	n, err := unix.Llistxattr(p, buf)
	if err != nil || n == 0 {
		return ""
	}
	var lines []string
	for _, k := range strings.Split(string(buf[:n]), "\x00") {
		if !strings.HasPrefix(k, "user.") && !strings.HasPrefix(k, "security.") {
			continue
		}
		v := make([]byte, 1024)
		m, err := unix.Lgetxattr(p, k, v)
		if err == nil {
			lines = append(lines, k+"="+string(v[:m]))
		}
	}
	return strings.Join(lines, "\n")
}

// tempDir is t.TempDir under a name safe in overlay mount options (test
// names may hold ',' and ':').
func tempDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "layertest")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func requireRoot(t *testing.T) {
	t.Helper()
	ocitest.RequireRoot(t)
}
