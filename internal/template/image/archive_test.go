package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/oci/ocitest"
)

// dockerSave writes imgs as `docker save` does, to dir/name.
func dockerSave(t *testing.T, dir, file string, imgs ...v1.Image) string {
	t.Helper()
	m := map[name.Tag]v1.Image{}
	for n, img := range imgs {
		tag, _ := name.NewTag("kiln/app:v" + string(rune('1'+n)))
		m[tag] = img
	}
	p := filepath.Join(dir, file)
	if err := tarball.MultiWriteToFile(p, m); err != nil {
		t.Fatal(err)
	}
	return p
}

// ociArchive writes an OCI image layout holding what add puts in it and
// tars it (gzipped if asked) to dir/file.
func ociArchive(t *testing.T, dir, file string, gz bool, add func(layout.Path) error) string {
	t.Helper()
	src := t.TempDir()
	p, err := layout.Write(src, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := add(p); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.AddFS(os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
	tw.Close()
	out := filepath.Join(dir, file)
	if err := os.WriteFile(out, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	if gz {
		return gzipFile(t, out)
	}
	return out
}

// gzipFile writes a gzipped copy of p to p+".gz".
func gzipFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var zb bytes.Buffer
	zw := gzip.NewWriter(&zb)
	zw.Write(b)
	zw.Close()
	if err := os.WriteFile(p+".gz", zb.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return p + ".gz"
}

// TestLoad reads uploaded archives: docker save and OCI layout tarballs
// (plain and gzipped, single image or index), unpacks their layers and
// checks them as TestPullUnpack does; bad archives are refused clearly.
func TestLoad(t *testing.T) {
	ocitest.RequireRoot(t)
	lower, upper := testLayer(t, lowerEnts), testLayer(t, upperEnts)
	img := testImage(t, fixtureConfig, lower, upper)
	arm := platformImage(t, "linux", "arm64", "arm64")
	amdPlat := layout.WithPlatform(v1.Platform{OS: "linux", Architecture: "amd64"})
	dir := t.TempDir()

	docker := dockerSave(t, dir, "docker.tar", img)
	good := map[string]string{
		"docker save":         docker,
		"docker save, gzip":   gzipFile(t, docker),
		"OCI layout, image":   ociArchive(t, dir, "oci.tar", false, func(p layout.Path) error { return p.AppendImage(img) }),
		"OCI layout, gzipped": ociArchive(t, dir, "oci-gz.tar", true, func(p layout.Path) error { return p.AppendImage(img, amdPlat) }),
		"OCI layout, index": ociArchive(t, dir, "index.tar", false, func(p layout.Path) error {
			return p.AppendIndex(mutate.AppendManifests(empty.Index,
				mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
				mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}}))
		}),
	}
	for name, archive := range good {
		t.Run(name, func(t *testing.T) {
			before := entries(t, dir)
			i, err := Load(context.Background(), archive, "upload-1", 64<<20)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if diff := cmp.Diff(fixtureConfig.Env, i.Config().Env); diff != "" {
				t.Errorf("config env (-want +got):\n%s", diff)
			}
			out := t.TempDir()
			for n, want := range []map[string]string{lowerWant, upperWant} {
				l := i.Layers()[n]
				if l.Key != diffID(t, []v1.Layer{lower, upper}[n]) {
					t.Errorf("layer %d key %s, want its diffID", n, l.Key)
				}
				d := filepath.Join(out, l.Key)
				if _, err := l.Unpack(context.Background(), d, UnpackOptions{MaxBytes: 1 << 20}); err != nil {
					t.Fatalf("Unpack layer %d: %v", n, err)
				}
				if diff := cmp.Diff(want, describe(t, d)); diff != "" {
					t.Errorf("layer %d (-want +got):\n%s", n, diff)
				}
			}
			if err := i.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			if after := entries(t, dir); !slices.Equal(before, after) {
				t.Errorf("beside the archive after Close: %v, want %v", after, before)
			}
		})
	}

	notTar := filepath.Join(dir, "random.bin")
	os.WriteFile(notTar, bytes.Repeat([]byte("not a tar "), 100), 0o600)
	plain := filepath.Join(dir, "plain.tar")
	os.WriteFile(plain, layerTar(t, []ent{{name: "hello.txt", body: "hi"}}), 0o600)
	for _, tc := range []struct {
		name, archive string
		max           int64
		class         error
		msg           string
	}{
		{"not a tar", notTar, 64 << 20, errdefs.ErrInvalidArgument, "archive upload-1 is not a tar archive"},
		{"a tar of no image", plain, 64 << 20, errdefs.ErrInvalidArgument, "neither an OCI image layout"},
		{"two images", dockerSave(t, dir, "two.tar", img, arm), 64 << 20, errdefs.ErrInvalidArgument, "archive upload-1 is not a valid image"},
		{"OCI layout without linux/amd64", ociArchive(t, dir, "arm.tar", false, func(p layout.Path) error {
			return p.AppendImage(arm, layout.WithPlatform(v1.Platform{OS: "linux", Architecture: "arm64"}))
		}), 64 << 20, errdefs.ErrInvalidArgument, "has no linux/amd64 image (it has: linux/arm64)"},
		{"OCI layout over the limit", good["OCI layout, gzipped"], 1000, errdefs.ErrResourceExhausted, "unpacks to more than 1000 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := entries(t, dir)
			_, err := Load(context.Background(), tc.archive, "upload-1", tc.max)
			if !errors.Is(err, tc.class) || !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("Load: %v, want %v saying %q", err, tc.class, tc.msg)
			}
			if strings.Contains(err.Error(), dir) {
				t.Errorf("error %q names a host path", err)
			}
			if after := entries(t, dir); !slices.Equal(before, after) {
				t.Errorf("beside the archive after a failed Load: %v, want %v", after, before)
			}
		})
	}
	if _, err := Load(context.Background(), filepath.Join(dir, "missing.tar"), "upload-2", 1<<20); !errors.Is(err, errdefs.ErrInvalidArgument) || strings.Contains(err.Error(), dir) {
		t.Errorf("Load of a missing file: %v", err)
	}
}
