package image

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/errdefs"
)

const password = "s3cret-pass"

// platformImage is a one-layer image whose config says os/arch.
func platformImage(t *testing.T, os, arch, marker string) v1.Image {
	t.Helper()
	img := testImage(t, v1.Config{Env: []string{"MARKER=" + marker}}, testLayer(t, []ent{{name: marker, body: marker}}))
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = os, arch
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

// pushIndex pushes an index of imgs, each described with its platform.
func pushIndex(t *testing.T, ref string, imgs map[string]v1.Image) {
	t.Helper()
	var adds []mutate.IndexAddendum
	for p, img := range imgs {
		plat, err := v1.ParsePlatform(p)
		if err != nil {
			t.Fatal(err)
		}
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: plat}})
	}
	r, _ := name.ParseReference(ref)
	if err := remote.WriteIndex(r, mutate.AppendManifests(empty.Index, adds...)); err != nil {
		t.Fatalf("pushing index %s: %v", ref, err)
	}
}

// TestPull pulls from registries on loopback that the test starts and
// pushes to: public and private, images and indexes, and every way a pull
// goes wrong, each with its class and a message that names the registry
// and the image but never the password.
func TestPull(t *testing.T) {
	pub := startRegistry(t, nil)
	priv := startRegistry(t, basicAuth("kiln", password))
	stalled := startRegistry(t, func(http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()

	amd := platformImage(t, "linux", "amd64", "amd64")
	push(t, pub+"/app:v1", amd, nil)
	push(t, priv+"/app:v1", amd, &authn.Basic{Username: "kiln", Password: password})
	push(t, pub+"/armonly:v1", platformImage(t, "linux", "arm64", "arm64"), nil)
	pushIndex(t, pub+"/multi:v1", map[string]v1.Image{
		"linux/arm64": platformImage(t, "linux", "arm64", "arm64"),
		"linux/amd64": amd,
	})
	pushIndex(t, pub+"/noamd:v1", map[string]v1.Image{
		"linux/arm64":  platformImage(t, "linux", "arm64", "arm64"),
		"linux/arm/v7": platformImage(t, "linux", "arm", "arm"),
	})
	right := &api.RegistryAuth{Username: "kiln", Password: password}
	wrong := &api.RegistryAuth{Username: "kiln", Password: "not-" + password}

	for _, tc := range []struct {
		name    string
		ref     string
		auth    *api.RegistryAuth
		timeout time.Duration
		class   error    // nil: success
		msg     []string // in the error
	}{
		{name: "public", ref: pub + "/app:v1"},
		{name: "private, right password", ref: priv + "/app:v1", auth: right},
		{name: "index picks linux/amd64", ref: pub + "/multi:v1"},
		{name: "private, wrong password", ref: priv + "/app:v1", auth: wrong, class: errdefs.ErrPermissionDenied,
			msg: []string{"registry " + priv + " refused the credentials for " + priv + "/app:v1"}},
		{name: "private, anonymous", ref: priv + "/app:v1", class: errdefs.ErrPermissionDenied,
			msg: []string{"registry " + priv + " refused anonymous access to " + priv + "/app:v1"}},
		{name: "unknown tag", ref: pub + "/app:nope", class: errdefs.ErrNotFound,
			msg: []string{"image " + pub + "/app:nope not found in registry " + pub}},
		{name: "unknown repository", ref: pub + "/nothing:v1", auth: right, class: errdefs.ErrNotFound,
			msg: []string{"not found in registry " + pub}},
		{name: "unreachable registry", ref: closed + "/app:v1", auth: right, class: errdefs.ErrUnavailable,
			msg: []string{"registry " + closed + " is unreachable (connection refused)"}},
		{name: "registry that never answers", ref: stalled + "/app:v1", timeout: 2 * time.Second, class: errdefs.ErrDeadlineExceeded,
			msg: []string{"pulling " + stalled + "/app:v1: registry " + stalled + " did not answer in time"}},
		{name: "malformed reference", ref: "Not A Reference!", class: errdefs.ErrInvalidArgument,
			msg: []string{`malformed image reference "Not A Reference!"`}},
		{name: "index without linux/amd64", ref: pub + "/noamd:v1", class: errdefs.ErrInvalidArgument,
			msg: []string{"image " + pub + "/noamd:v1 has no linux/amd64 image (it has: linux/arm, linux/arm64)"}},
		{name: "image for another architecture", ref: pub + "/armonly:v1", class: errdefs.ErrInvalidArgument,
			msg: []string{"is for linux/arm64, not linux/amd64"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			if tc.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.timeout)
				defer cancel()
			}
			img, err := Pull(ctx, tc.ref, tc.auth, nil)
			if tc.class == nil {
				if err != nil {
					t.Fatalf("Pull: %v", err)
				}
				if got := img.Config().Env; !cmp.Equal(got, []string{"MARKER=amd64"}) {
					t.Errorf("pulled the image with env %v, want the amd64 one", got)
				}
				if len(img.Layers()) != 1 || img.Layers()[0].Key != diffID(t, mustLayers(t, amd)[0]) {
					t.Errorf("layers %+v, want the amd64 image's", img.Layers())
				}
				return
			}
			t.Log(err)
			if !errors.Is(err, tc.class) {
				t.Fatalf("Pull: %v, want class %v", err, tc.class)
			}
			for _, m := range tc.msg {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q does not say %q", err, m)
				}
			}
			if strings.Contains(err.Error(), password) {
				t.Errorf("error %q quotes the password", err)
			}
		})
	}
}

func mustLayers(t *testing.T, img v1.Image) []v1.Layer {
	t.Helper()
	ls, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	return ls
}

func TestConfig(t *testing.T) {
	img, _ := pullFixture(t)
	want := Config{
		Env:     []string{"PATH=/usr/bin:/bin", "GREETING=hello world"},
		User:    "1000",
		Workdir: "/home/user",
		Cmd:     `/bin/tool --flag 'it'\''s'`,
	}
	if diff := cmp.Diff(want, img.Config()); diff != "" {
		t.Errorf("Config (-want +got):\n%s", diff)
	}
	for _, tc := range []struct {
		entrypoint, cmd []string
		want            string
	}{
		{nil, nil, ""},
		{nil, []string{"/bin/sh", "-c", "python -m http.server 8000 & wait"}, "python -m http.server 8000 & wait"},
		{[]string{"/docker-entrypoint.sh"}, []string{"nginx", "-g", "daemon off;"}, `/docker-entrypoint.sh nginx -g 'daemon off;'`},
		{[]string{"env", "FOO=bar"}, []string{"a b", "$HOME", ""}, `env 'FOO=bar' 'a b' '$HOME' ''`},
		{nil, []string{"/bin/sh", "-c", "echo", "extra"}, `/bin/sh -c echo extra`},
	} {
		if got := configOf(v1.Config{Entrypoint: tc.entrypoint, Cmd: tc.cmd}).Cmd; got != tc.want {
			t.Errorf("entrypoint %q cmd %q: Cmd = %s, want %s", tc.entrypoint, tc.cmd, got, tc.want)
		}
	}
}
