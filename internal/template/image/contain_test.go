package image

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/oci/ocitest"
)

// unpackEnts unpacks a layer of ents, pulled from a registry, into
// layers/L under a fresh dir that also holds outside/secret.
func unpackEnts(t *testing.T, base string, ents []ent, o UnpackOptions) (string, error) {
	t.Helper()
	host := startRegistry(t, nil)
	push(t, host+"/evil:v1", testImage(t, v1.Config{}, testLayer(t, ents)), nil)
	img, err := Pull(context.Background(), host+"/evil:v1", nil, nil)
	if err != nil {
		t.Fatalf("Pull: %v", err)
	}
	dst := filepath.Join(base, "layers", "L")
	_, err = img.Layers()[0].Unpack(context.Background(), dst, o)
	return dst, err
}

// TestUnpackContained unpacks hostile layers: names that climb out or are
// absolute are kept inside the layer; writes, links, whiteouts and opaque
// marks through a symlink are refused. Nothing outside the layer changes,
// and a refused layer leaves nothing behind.
func TestUnpackContained(t *testing.T) {
	ocitest.RequireRoot(t)
	for _, tc := range []struct {
		name string
		ents func(outside string) []ent
		want map[string]string // layer paths and contents; nil: refused
	}{
		{"dot-dot name", func(string) []ent { return []ent{{name: "../x", body: "x"}} },
			map[string]string{"x": "x"}},
		{"deep dot-dot name", func(string) []ent { return []ent{{name: "a/../../../outside/secret", body: "x"}} },
			map[string]string{"outside/secret": "x"}},
		{"absolute name", func(string) []ent { return []ent{{name: "/abs/f", body: "f"}} },
			map[string]string{"abs/f": "f"}},
		{"absolute host path", func(out string) []ent { return []ent{{name: out + "/secret", body: "pwned"}} },
			map[string]string{"$OUTSIDE/secret": "pwned"}}, // the host path, inside the layer
		{"symlink replaced by a dir", func(out string) []ent {
			return []ent{{name: "evil", typ: '2', link: out}, {name: "evil/", typ: '5'}, {name: "evil/f", body: "f"}}
		}, map[string]string{"evil/f": "f"}},
		{"write through an absolute symlink", func(out string) []ent {
			return []ent{{name: "evil", typ: '2', link: out}, {name: "evil/pwned", body: "x"}}
		}, nil},
		{"write through a relative symlink", func(string) []ent {
			return []ent{{name: "up", typ: '2', link: "../../outside"}, {name: "up/pwned", body: "x"}}
		}, nil},
		{"write through a symlink to a layer dir", func(string) []ent {
			return []ent{{name: "d/", typ: '5'}, {name: "s", typ: '2', link: "d"}, {name: "s/f", body: "x"}}
		}, nil},
		{"overwrite through a symlink to a file", func(out string) []ent {
			return []ent{{name: "evil", typ: '2', link: out}, {name: "evil/secret", body: "x"}}
		}, nil},
		{"hard link out of the layer", func(string) []ent {
			return []ent{{name: "hl", typ: '1', link: "../../outside/secret"}}
		}, nil},
		{"hard link through a symlink", func(out string) []ent {
			return []ent{{name: "evil", typ: '2', link: out}, {name: "hl", typ: '1', link: "evil/secret"}}
		}, nil},
		{"whiteout through a symlink", func(out string) []ent {
			return []ent{{name: "evil", typ: '2', link: out}, {name: "evil/.wh.secret"}}
		}, nil},
		{"opaque mark under a symlink", func(out string) []ent { // the symlink becomes an opaque dir
			return []ent{{name: "evil", typ: '2', link: out}, {name: "evil/.wh..wh..opq"}, {name: "evil/f", body: "f"}}
		}, map[string]string{"evil/f": "f"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			outside := filepath.Join(base, "outside")
			os.MkdirAll(filepath.Join(base, "layers"), 0o755)
			os.Mkdir(outside, 0o755)
			os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o600)

			dst, err := unpackEnts(t, base, tc.ents(outside), UnpackOptions{MaxBytes: 1 << 20})
			if tc.want == nil {
				t.Log(err)
				if !errors.Is(err, errdefs.ErrInvalidArgument) {
					t.Errorf("Unpack: %v, want invalid argument", err)
				}
				if got := entries(t, filepath.Join(base, "layers")); len(got) != 0 {
					t.Errorf("after a refused layer: %v left", got)
				}
			} else {
				if err != nil {
					t.Fatalf("Unpack: %v", err)
				}
				for p, body := range tc.want {
					p = strings.ReplaceAll(p, "$OUTSIDE", strings.TrimPrefix(outside, "/"))
					if b, err := os.ReadFile(filepath.Join(dst, p)); err != nil || string(b) != body {
						t.Errorf("layer's %s: %q, %v; want %q", p, b, err, body)
					}
				}
			}
			if got := entries(t, outside); !slices.Equal(got, []string{"secret"}) {
				t.Errorf("outside the layer: %v, want only secret", got)
			}
			if b, _ := os.ReadFile(filepath.Join(outside, "secret")); string(b) != "secret" {
				t.Errorf("outside/secret = %q, changed", b)
			}
			if x := xattrList(t, outside); x != "" {
				t.Errorf("outside got xattrs%s", x)
			}
		})
	}
}

// TestUnpackLimits: a layer over the byte limit, by content or by its
// number of entries, fails with resource exhausted and leaves nothing.
func TestUnpackLimits(t *testing.T) {
	ocitest.RequireRoot(t)
	many := make([]ent, 3000)
	for n := range many {
		many[n] = ent{name: fmt.Sprintf("f%04d", n)}
	}
	for _, tc := range []struct {
		name  string
		ents  []ent
		max   int64
		class error
	}{
		{"within", []ent{{name: "big", size: 100 << 10}}, 1 << 20, nil},
		{"one big file", []ent{{name: "big", size: 2 << 20}}, 1 << 20, errdefs.ErrResourceExhausted},
		{"many empty files", many, 1 << 20, errdefs.ErrResourceExhausted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			os.Mkdir(filepath.Join(base, "layers"), 0o755)
			_, err := unpackEnts(t, base, tc.ents, UnpackOptions{MaxBytes: tc.max})
			if tc.class == nil {
				if err != nil {
					t.Fatalf("Unpack: %v", err)
				}
				return
			}
			if !errors.Is(err, tc.class) || !strings.Contains(err.Error(), "larger than the limit of 1048576 bytes") {
				t.Errorf("Unpack: %v, want %v", err, tc.class)
			}
			if got := entries(t, filepath.Join(base, "layers")); len(got) != 0 {
				t.Errorf("after the limit: %v left", got)
			}
		})
	}
}

// TestUnpackDigestMismatch: an image whose config claims another layer's
// diffID (to poison the layer that key names, shared between images) is
// refused once its content is seen, and nothing is published.
func TestUnpackDigestMismatch(t *testing.T) {
	ocitest.RequireRoot(t)
	innocent := testLayer(t, []ent{{name: "bin/sh", body: "real shell"}})
	evil := testLayer(t, []ent{{name: "bin/sh", body: "evil shell"}})
	img := testImage(t, v1.Config{}, evil)
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.RootFS.DiffIDs[0], _ = innocent.DiffID()
	img, err := mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	host := startRegistry(t, nil)
	push(t, host+"/liar:v1", img, nil)
	pulled, err := Pull(context.Background(), host+"/liar:v1", nil, nil)
	if err != nil {
		t.Fatalf("Pull: %v", err)
	}
	l := pulled.Layers()[0]
	if l.Key != diffID(t, innocent) {
		t.Fatalf("key %s, want the claimed (innocent) diffID", l.Key)
	}
	layers := t.TempDir()
	_, err = l.Unpack(context.Background(), filepath.Join(layers, l.Key), UnpackOptions{})
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "its content has digest sha256:"+diffID(t, evil)) {
		t.Errorf("Unpack: %v, want invalid argument naming the real digest", err)
	}
	if got := entries(t, layers); len(got) != 0 {
		t.Errorf("after a mismatch: %v left", got)
	}
}

// TestUnpackCancel: cancelling ctx stops an unpack whose download has
// stalled halfway, and leaves nothing.
func TestUnpackCancel(t *testing.T) {
	ocitest.RequireRoot(t)
	random := make([]byte, 4<<20)
	rand.Read(random)
	big := testLayer(t, []ent{{name: "random.bin", body: string(random)}})
	digest, _ := big.Digest()
	compressed, _ := big.Compressed()
	blob, _ := io.ReadAll(compressed)
	started := make(chan struct{})
	host := startRegistry(t, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodGet || !strings.HasSuffix(r.URL.Path, "/blobs/"+digest.String()) {
				next.ServeHTTP(w, r)
				return
			}
			w.Header().Set("Content-Length", fmt.Sprint(len(blob)))
			w.Write(blob[:len(blob)/2])
			w.(http.Flusher).Flush()
			close(started)
			<-r.Context().Done()
		})
	})
	push(t, host+"/big:v1", testImage(t, v1.Config{}, big), nil)
	img, err := Pull(context.Background(), host+"/big:v1", nil, nil)
	if err != nil {
		t.Fatalf("Pull: %v", err)
	}
	layers := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := img.Layers()[0].Unpack(ctx, filepath.Join(layers, "L"), UnpackOptions{})
		done <- err
	}()
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("Unpack ended before the download stalled: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("the download did not start within 60 s")
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Unpack after cancel: %v, want context.Canceled", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Unpack did not stop within 60 s of its cancel")
	}
	if got := entries(t, layers); len(got) != 0 {
		t.Errorf("after a cancelled unpack: %v left", got)
	}
}
