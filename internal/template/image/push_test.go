package image

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/oci/ocitest"
)

// TestPushRoundTrip: layers unpacked from an image, pushed and pulled
// again, unpack to the same directories (whiteouts, opaque directories,
// owners, modes, times, xattrs, hard and symbolic links, FIFOs), with the
// same config and manifest annotations; pushing the same layers again
// gives the same image.
func TestPushRoundTrip(t *testing.T) {
	ocitest.RequireRoot(t)
	ctx := context.Background()
	img, _ := pullFixture(t)
	dir := t.TempDir()
	for _, d := range []string{"first", "second"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	first := unpackAll(t, img, filepath.Join(dir, "first"))
	host := startRegistry(t, nil)

	cfg := img.Config()
	cfg.Annotations = map[string]string{"sh.kiln.builtin": "base:0123abcd", "sh.kiln.build": "b123"}
	d1, err := Push(ctx, host+"/kiln/pushed:v1", first, cfg, nil, nil)
	if err != nil {
		t.Fatalf("Push: %v", err)
	}
	again, err := Pull(ctx, host+"/kiln/pushed:v1", nil, nil)
	if err != nil {
		t.Fatalf("Pull of the pushed image: %v", err)
	}
	if diff := cmp.Diff(cfg, again.Config()); diff != "" {
		t.Errorf("config after the round trip (-want +got):\n%s", diff)
	}
	second := unpackAll(t, again, filepath.Join(dir, "second"))
	for n, want := range []map[string]string{lowerWant, upperWant} {
		if diff := cmp.Diff(want, describe(t, second[n])); diff != "" {
			t.Errorf("layer %d after the round trip (-want +got):\n%s", n, diff)
		}
	}
	a, _ := os.Stat(filepath.Join(second[0], "bin/tool"))
	b, _ := os.Stat(filepath.Join(second[0], "bin/tool-again"))
	if !os.SameFile(a, b) {
		t.Error("bin/tool-again is no longer a hard link of bin/tool")
	}
	d2, err := Push(ctx, host+"/kiln/pushed:v2", second, cfg, nil, nil)
	if err != nil {
		t.Fatalf("Push again: %v", err)
	}
	if d1 != d2 {
		t.Errorf("the same layers and config pushed twice: %s, then %s", d1, d2)
	}
}

func TestPushErrors(t *testing.T) {
	ocitest.RequireRoot(t)
	ctx := context.Background()
	layer := t.TempDir()
	if err := os.WriteFile(filepath.Join(layer, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	open := startRegistry(t, nil)
	locked := startRegistry(t, basicAuth("u", "p"))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	for _, tc := range []struct {
		name   string
		ref    string
		layers []string
		auth   *api.RegistryAuth
		guard  Guard
		want   error
	}{
		{"malformed reference", "Not A Ref!", []string{layer}, nil, nil, errdefs.ErrInvalidArgument},
		{"anonymous push refused", locked + "/kiln/x:v1", []string{layer}, nil, nil, errdefs.ErrPermissionDenied},
		{"wrong credentials", locked + "/kiln/x:v1", []string{layer}, &api.RegistryAuth{Username: "u", Password: "s3cr3t-wrong"}, nil, errdefs.ErrPermissionDenied},
		{"registry down", closed + "/kiln/x:v1", []string{layer}, nil, nil, errdefs.ErrUnavailable},
		{"loopback refused by the guard", open + "/kiln/x:v1", []string{layer}, nil, ServerGuard(false), errdefs.ErrPermissionDenied},
		{"layer dir missing", open + "/kiln/x:v1", []string{filepath.Join(layer, "none")}, nil, nil, errLayerRead},
		{"right credentials", locked + "/kiln/x:v1", []string{layer}, &api.RegistryAuth{Username: "u", Password: "p"}, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Push(ctx, tc.ref, tc.layers, Config{}, tc.auth, tc.guard)
			if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("Push: %v, want %v", err, tc.want)
			}
			if err != nil && strings.Contains(err.Error(), "s3cr3t") {
				t.Errorf("the error shows the password: %v", err)
			}
		})
	}
}
