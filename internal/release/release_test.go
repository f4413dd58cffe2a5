package release

import (
	"archive/tar"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"
)

// rootfs makes two overlay layer dirs, bottom first: the top one hides a
// file of the bottom one with a whiteout and replaces a directory with
// an opaque one (both need root: mknod and a trusted.* xattr).
func rootfs(t *testing.T, root bool) []string {
	t.Helper()
	bottom, top := t.TempDir(), t.TempDir()
	for _, f := range []struct{ dir, path, body string }{
		{bottom, "etc/os-release", "ID=debian\n"},
		{bottom, "etc/gone", "hidden by a whiteout above"},
		{bottom, "opt/old/file", "hidden by an opaque dir above"},
		{bottom, "usr/bin/tool", "#!/bin/sh\n"},
		{top, "etc/hostname", "kiln\n"},
		{top, "opt/new", "kept"},
	} {
		p := filepath.Join(f.dir, f.path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(f.body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("usr/bin", filepath.Join(bottom, "bin")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(bottom, "usr/bin/tool"), filepath.Join(bottom, "usr/bin/tool2")); err != nil {
		t.Fatal(err)
	}
	if root {
		if err := unix.Mknod(filepath.Join(top, "etc/gone"), unix.S_IFCHR|0o000, 0); err != nil {
			t.Fatal(err)
		}
		if err := unix.Setxattr(filepath.Join(top, "opt"), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
			t.Fatal(err)
		}
	}
	return []string{bottom, top}
}

func TestBuild(t *testing.T) {
	root := os.Geteuid() == 0
	dir := t.TempDir()
	bin := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	o := Options{
		Rootfs: rootfs(t, root),
		Kiln:   bin("kiln", "kiln binary"), Agent: bin("kiln-agent", "agent binary"),
		Runsc: bin("runsc", "runsc binary"), Runc: bin("runc", "runc binary"),
		Tag:    "kiln:test",
		Layout: filepath.Join(dir, "layout"), Tarball: filepath.Join(dir, "kiln.tar"),
	}
	// A registry on loopback to push to (go-containerregistry's, in memory).
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	o.Push = strings.TrimPrefix(reg.URL, "http://") + "/kiln:test"
	digest, err := Build(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	// The same inputs give the same image.
	o2 := o
	o2.Layout, o2.Tarball = filepath.Join(dir, "layout2"), ""
	if again, err := Build(t.Context(), o2); err != nil || again != digest {
		t.Errorf("second build: %v, %v; want the same digest %v", again, err, digest)
	}

	p, err := layout.FromPath(o.Layout)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 || im.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "test" {
		t.Fatalf("layout index: %+v, want one image named test", im.Manifests)
	}
	fromLayout, err := p.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	fromTar, err := tarball.ImageFromPath(o.Tarball, nil)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(o.Push)
	if err != nil {
		t.Fatal(err)
	}
	pushed, err := remote.Image(ref, remote.WithContext(t.Context()))
	if err != nil {
		t.Fatalf("pulling the pushed image back: %v", err)
	}
	if d, err := pushed.Digest(); err != nil || d != digest {
		t.Errorf("pushed image's digest %v, %v; want %v", d, err, digest)
	}
	for name, img := range map[string]v1.Image{"layout": fromLayout, "tarball": fromTar, "registry": pushed} {
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.OS != "linux" || cf.Architecture != "amd64" {
			t.Errorf("%s: platform %s/%s, want linux/amd64", name, cf.OS, cf.Architecture)
		}
		if diff := cmp.Diff([]string{KilnPath, "serve"}, append(cf.Config.Entrypoint, cf.Config.Cmd...)); diff != "" {
			t.Errorf("%s: entrypoint and cmd (-want +got):\n%s", name, diff)
		}
		if !slices.Contains(cf.Config.Env, "KILN_DATA_DIR=/var/lib/kiln") {
			t.Errorf("%s: env %v lacks the data dir", name, cf.Config.Env)
		}
		layers, err := img.Layers()
		if err != nil || len(layers) != 3 {
			t.Fatalf("%s: %d layers, %v; want 3 (two rootfs, kiln)", name, len(layers), err)
		}
		got := flatten(t, img)
		want := map[string]string{
			"usr/local/bin/kiln": "kiln binary", "usr/local/bin/kiln-agent": "agent binary",
			"usr/local/lib/kiln/runsc": "runsc binary", "usr/local/bin/runc": "runc binary",
			"etc/os-release": "ID=debian\n", "etc/hostname": "kiln\n", "opt/new": "kept",
			"usr/bin/tool": "#!/bin/sh\n", "usr/bin/tool2": "#!/bin/sh\n", "bin": "-> usr/bin",
		}
		if !root { // no whiteout or opaque dir in the layers
			want["etc/gone"] = "hidden by a whiteout above"
			want["opt/old/file"] = "hidden by an opaque dir above"
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s: the image's files (-want +got):\n%s", name, diff)
		}
	}
}

// flatten is the image's file system as its regular files' contents
// and its symlinks' targets ("-> target"), whiteouts applied; binaries
// are executable.
func flatten(t *testing.T, img v1.Image) map[string]string {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	files := map[string]string{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		switch h.Typeflag {
		case tar.TypeReg:
			b, _ := io.ReadAll(tr)
			files[h.Name] = string(b)
			if filepath.Dir(h.Name) == "usr/local/bin" && h.Mode&0o111 == 0 {
				t.Errorf("%s is not executable (mode %o)", h.Name, h.Mode)
			}
		case tar.TypeSymlink:
			files[h.Name] = "-> " + h.Linkname
		case tar.TypeLink:
			files[h.Name] = files[h.Linkname]
		}
	}
}
