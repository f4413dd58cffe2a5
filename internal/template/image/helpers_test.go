package image

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"
)

// ent is one tar entry of a test layer.
type ent struct {
	name   string
	typ    byte // tar.Type*; 0: regular file
	body   string
	mode   int64 // 0: 0644 for files, 0755 for dirs, 0777 for symlinks
	uid    int
	gid    int
	link   string // symlink or hard link target
	xattrs map[string]string
	size   int64 // for a regular file with no body: this many zero bytes
}

// mtime is every test entry's modification time.
var mtime = time.Date(2021, 2, 3, 4, 5, 6, 0, time.UTC)

// layerTar writes entries as an uncompressed tar, PAX format.
func layerTar(t testing.TB, ents []ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Uid: e.uid, Gid: e.gid,
			Linkname: e.link, ModTime: mtime, Format: tar.FormatPAX}
		body := []byte(e.body)
		if e.size > 0 {
			body = make([]byte, e.size)
		}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(body))
		}
		if h.Mode == 0 {
			h.Mode = map[byte]int64{tar.TypeDir: 0o755, tar.TypeSymlink: 0o777}[h.Typeflag]
			if h.Mode == 0 {
				h.Mode = 0o644
			}
		}
		for k, v := range e.xattrs {
			if h.PAXRecords == nil {
				h.PAXRecords = map[string]string{}
			}
			h.PAXRecords["SCHILY.xattr."+k] = v
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatalf("tar header %s: %v", e.name, err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write(body)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// testLayer is a gzipped image layer of ents.
func testLayer(t testing.TB, ents []ent) v1.Layer {
	t.Helper()
	b := layerTar(t, ents)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// testImage is an image of layers (bottom first) with cfg.
func testImage(t testing.TB, cfg v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Config = "linux", "amd64", cfg
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

// startRegistry serves an in-memory registry on loopback, behind wrap if
// given, and returns its host:port.
func startRegistry(t testing.TB, wrap func(http.Handler) http.Handler) string {
	t.Helper()
	var h http.Handler = registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	if wrap != nil {
		h = wrap(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// basicAuth is a registry's front door that wants user:pass.
func basicAuth(user, pass string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if u, p, ok := r.BasicAuth(); !ok || u != user || p != pass {
				w.Header().Set("WWW-Authenticate", `Basic realm="kiln-test"`)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusUnauthorized)
				io.WriteString(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// push writes img to ref (host/repo:tag) with auth (nil: anonymous).
func push(t testing.TB, ref string, img v1.Image, auth authn.Authenticator) {
	t.Helper()
	if auth == nil {
		auth = authn.Anonymous
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img, remote.WithAuth(auth)); err != nil {
		t.Fatalf("pushing %s: %v", ref, err)
	}
}

// diffID is the key a layer must come back with.
func diffID(t testing.TB, l v1.Layer) string {
	t.Helper()
	h, err := l.DiffID()
	if err != nil {
		t.Fatal(err)
	}
	return h.Hex
}

// describe lists every path under dir (relative, "." for dir) with what a
// layer must preserve: type, mode, owner, mtime, content, link target,
// xattrs and link count.
func describe(t testing.TB, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		st := fi.Sys().(*syscall.Stat_t)
		var s string
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			s = "dir"
		case unix.S_IFREG:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if len(b) > 64 {
				s = fmt.Sprintf("file sha256=%x", sha256.Sum256(b))
			} else {
				s = fmt.Sprintf("file %q", b)
			}
			if st.Nlink > 1 {
				s += fmt.Sprintf(" nlink=%d", st.Nlink)
			}
		case unix.S_IFLNK:
			target, _ := os.Readlink(p)
			s = "symlink " + target
		case unix.S_IFCHR:
			s = fmt.Sprintf("char %d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
		case unix.S_IFIFO:
			s = "fifo"
		default:
			s = "other"
		}
		s += fmt.Sprintf(" %04o %d:%d", st.Mode&0o7777, st.Uid, st.Gid)
		if st.Mode&unix.S_IFMT != unix.S_IFCHR && rel != "." {
			s += " " + time.Unix(st.Mtim.Unix()).UTC().Format(time.RFC3339)
		}
		s += xattrList(t, p)
		out[rel] = s
		return nil
	})
	if err != nil {
		t.Fatalf("walking the layer: %v", err)
	}
	return out
}

// xattrList is " k=v k=v" for p's xattrs, sorted.
func xattrList(t testing.TB, p string) string {
	buf := make([]byte, 4096)
	n, err := unix.Llistxattr(p, buf)
	if err != nil {
		return " xattrs?" + err.Error()
	}
	var l []string
	for _, k := range strings.Split(strings.TrimRight(string(buf[:n]), "\x00"), "\x00") {
		if k == "" || k == "security.selinux" {
			continue
		}
		v := make([]byte, 4096)
		m, _ := unix.Lgetxattr(p, k, v)
		l = append(l, k+"="+string(v[:max(m, 0)]))
	}
	sort.Strings(l)
	if len(l) == 0 {
		return ""
	}
	return " " + strings.Join(l, " ")
}

// entries lists the names in dir.
func entries(t testing.TB, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var l []string
	for _, d := range des {
		l = append(l, d.Name())
	}
	return l
}
