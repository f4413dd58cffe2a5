package image

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/oci/ocitest"
)

// A two-layer image with every kind of entry: the lower layer has files,
// directories, a setuid binary, a hard link, a symlink, a FIFO, owners and
// an xattr; the upper one deletes a file (whiteout), replaces a directory
// (opaque) and tries to set overlayfs's own xattrs (dropped).
var (
	lowerEnts = []ent{
		{name: "etc/", typ: '5'},
		{name: "etc/app.conf", body: "a=1\n", mode: 0o640, gid: 42},
		{name: "bin/", typ: '5'},
		{name: "bin/tool", body: "#!/bin/sh\necho tool\n", mode: 0o4755},
		{name: "bin/tool-again", typ: '1', link: "bin/tool"},
		{name: "bin/sh-link", typ: '2', link: "/bin/tool", xattrs: map[string]string{"user.x": "1"}}, // not on a symlink: left out
		{name: "home/", typ: '5'},
		{name: "home/user/", typ: '5', mode: 0o750, uid: 1000, gid: 1000},
		{name: "home/user/notes", body: "hi", uid: 1000, gid: 1000, xattrs: map[string]string{"user.note": "yes"}},
		{name: "tmp/", typ: '5', mode: 0o1777},
		{name: "run/", typ: '5'},
		{name: "run/pipe", typ: '6', mode: 0o600},
		{name: "gone.txt", body: "bye"},
		{name: "cache/", typ: '5'},
		{name: "cache/a", body: "A"},
		{name: "cache/sub/", typ: '5'},
		{name: "cache/sub/b", body: "B"},
	}
	upperEnts = []ent{
		{name: ".wh.gone.txt"},
		{name: "cache/", typ: '5', mode: 0o700},
		{name: "cache/.wh..wh..opq"},
		{name: "cache/new", body: "N"},
		{name: "etc/", typ: '5', xattrs: map[string]string{"trusted.overlay.opaque": "y"}},
		{name: "etc/extra", body: "x", xattrs: map[string]string{"user.x": "1", "trusted.overlay.redirect": "/cache"}},
	}
	lowerWant = map[string]string{
		".":               "dir 0755 0:0",
		"etc":             "dir 0755 0:0 2021-02-03T04:05:06Z",
		"etc/app.conf":    `file "a=1\n" 0640 0:42 2021-02-03T04:05:06Z`,
		"bin":             "dir 0755 0:0 2021-02-03T04:05:06Z",
		"bin/tool":        `file "#!/bin/sh\necho tool\n" nlink=2 4755 0:0 2021-02-03T04:05:06Z`,
		"bin/tool-again":  `file "#!/bin/sh\necho tool\n" nlink=2 4755 0:0 2021-02-03T04:05:06Z`,
		"bin/sh-link":     "symlink /bin/tool 0777 0:0 2021-02-03T04:05:06Z",
		"home":            "dir 0755 0:0 2021-02-03T04:05:06Z",
		"home/user":       "dir 0750 1000:1000 2021-02-03T04:05:06Z",
		"home/user/notes": `file "hi" 0644 1000:1000 2021-02-03T04:05:06Z user.note=yes`,
		"tmp":             "dir 1777 0:0 2021-02-03T04:05:06Z",
		"run":             "dir 0755 0:0 2021-02-03T04:05:06Z",
		"run/pipe":        "fifo 0600 0:0 2021-02-03T04:05:06Z",
		"gone.txt":        `file "bye" 0644 0:0 2021-02-03T04:05:06Z`,
		"cache":           "dir 0755 0:0 2021-02-03T04:05:06Z",
		"cache/a":         `file "A" 0644 0:0 2021-02-03T04:05:06Z`,
		"cache/sub":       "dir 0755 0:0 2021-02-03T04:05:06Z",
		"cache/sub/b":     `file "B" 0644 0:0 2021-02-03T04:05:06Z`,
	}
	upperWant = map[string]string{
		".":         "dir 0755 0:0",
		"gone.txt":  "char 0:0 0600 0:0",
		"cache":     "dir 0700 0:0 2021-02-03T04:05:06Z trusted.overlay.opaque=y",
		"cache/new": `file "N" 0644 0:0 2021-02-03T04:05:06Z`,
		"etc":       "dir 0755 0:0 2021-02-03T04:05:06Z",
		"etc/extra": `file "x" 0644 0:0 2021-02-03T04:05:06Z user.x=1`,
	}
	fixtureConfig = v1.Config{
		Env:        []string{"PATH=/usr/bin:/bin", "GREETING=hello world"},
		User:       "1000",
		WorkingDir: "/home/user",
		Entrypoint: []string{"/bin/tool"},
		Cmd:        []string{"--flag", "it's"},
	}
)

// pullFixture pushes the two-layer image to a loopback registry and
// pulls it back.
func pullFixture(t *testing.T) (*Image, []v1.Layer) {
	t.Helper()
	lower, upper := testLayer(t, lowerEnts), testLayer(t, upperEnts)
	host := startRegistry(t, nil)
	push(t, host+"/kiln/fixture:v1", testImage(t, fixtureConfig, lower, upper), nil)
	img, err := Pull(context.Background(), host+"/kiln/fixture:v1", nil, nil)
	if err != nil {
		t.Fatalf("Pull: %v", err)
	}
	return img, []v1.Layer{lower, upper}
}

// unpackAll unpacks every layer of img under dir, bottom first, into
// dir/0, dir/1, …
func unpackAll(t *testing.T, img *Image, dir string) []string {
	t.Helper()
	var dirs []string
	for n, l := range img.Layers() {
		d := filepath.Join(dir, string(rune('0'+n)))
		if _, err := l.Unpack(context.Background(), d, UnpackOptions{MaxBytes: 1 << 20}); err != nil {
			t.Fatalf("Unpack layer %d: %v", n, err)
		}
		dirs = append(dirs, d)
	}
	return dirs
}

func TestPullUnpack(t *testing.T) {
	ocitest.RequireRoot(t)
	img, layers := pullFixture(t)
	if len(img.Layers()) != 2 {
		t.Fatalf("Layers() = %d layers, want 2", len(img.Layers()))
	}
	for n, l := range img.Layers() {
		if want := diffID(t, layers[n]); l.Key != want {
			t.Errorf("layer %d key = %s, want its diffID %s", n, l.Key, want)
		}
	}
	dir := t.TempDir()
	dirs := unpackAll(t, img, dir)
	for n, want := range []map[string]string{lowerWant, upperWant} {
		if diff := cmp.Diff(want, describe(t, dirs[n])); diff != "" {
			t.Errorf("layer %d unpacked (-want +got):\n%s", n, diff)
		}
	}
	if got := entries(t, dir); !slices.Equal(got, []string{"0", "1"}) {
		t.Errorf("beside the layers: %v, want only 0 and 1 (no temp dirs left)", got)
	}
	a, _ := os.Stat(filepath.Join(dirs[0], "bin/tool"))
	b, _ := os.Stat(filepath.Join(dirs[0], "bin/tool-again"))
	if !os.SameFile(a, b) {
		t.Error("bin/tool-again is not a hard link of bin/tool")
	}
	// A layer two images share has the same key: unpacking it again into
	// the same place is refused, not merged.
	_, err := img.Layers()[0].Unpack(context.Background(), dirs[0], UnpackOptions{})
	if !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("Unpack into a non-empty dir: %v, want already exists", err)
	}
	// An empty existing directory is filled.
	empty := filepath.Join(dir, "empty")
	os.Mkdir(empty, 0o755)
	if _, err := img.Layers()[1].Unpack(context.Background(), empty, UnpackOptions{}); err != nil {
		t.Errorf("Unpack into an empty dir: %v", err)
	}
}

// TestOverlayMount mounts the unpacked layers as overlayfs does for a
// sandbox: the whiteout hides the lower file, the opaque directory hides
// the lower one's contents, the dropped xattr makes nothing opaque.
func TestOverlayMount(t *testing.T) {
	ocitest.RequireRoot(t)
	img, _ := pullFixture(t)
	dir := t.TempDir()
	dirs := unpackAll(t, img, dir)
	merged := filepath.Join(dir, "merged")
	os.Mkdir(merged, 0o755)
	if err := unix.Mount("overlay", merged, "overlay", unix.MS_RDONLY, "lowerdir="+dirs[1]+":"+dirs[0]); err != nil {
		t.Fatalf("mounting the layers: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(merged, unix.MNT_DETACH) })

	if _, err := os.Lstat(filepath.Join(merged, "gone.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("gone.txt through the whiteout: %v, want not exist", err)
	}
	if got := entries(t, filepath.Join(merged, "cache")); !slices.Equal(got, []string{"new"}) {
		t.Errorf("opaque cache/ holds %v, want only [new]", got)
	}
	if got := entries(t, filepath.Join(merged, "etc")); !slices.Equal(got, []string{"app.conf", "extra"}) {
		t.Errorf("etc/ holds %v, want both layers' files (trusted.overlay.opaque from the tar dropped)", got)
	}
	if b, err := os.ReadFile(filepath.Join(merged, "bin/tool")); err != nil || !strings.Contains(string(b), "echo tool") {
		t.Errorf("bin/tool through the overlay: %q, %v", b, err)
	}
	if fi, err := os.Stat(filepath.Join(merged, "bin/tool")); err != nil || fi.Mode()&os.ModeSetuid == 0 {
		t.Errorf("bin/tool is not setuid through the overlay: %v, %v", fi, err)
	}
}
