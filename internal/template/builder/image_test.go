package builder_test

import (
	"archive/tar"
	"bytes"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/oci/ocitest"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/sandbox/sandboxtest"
	"github.com/kiln-sh/kiln/internal/template"
)

// miniImage is a small image with no user and no useradd (dash, grep and a
// few coreutils taken from the base template, in two layers, with merged
// /usr links), pushed to a registry on loopback that wants user:pass.
func miniImage(t *testing.T) string {
	t.Helper()
	root := ocitest.RequireRootfs(t)
	type ent struct {
		name, link string
		data       []byte
		mode       int64
	}
	read := func(p string) []byte {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	libs := []ent{
		{name: "bin", link: "usr/bin"}, {name: "lib", link: "usr/lib"}, {name: "lib64", link: "usr/lib64"},
		{name: "usr/lib64/ld-linux-x86-64.so.2", link: "../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"},
		{name: "etc/passwd", data: []byte("root:x:0:0:root:/root:/bin/sh\n"), mode: 0o644},
		{name: "etc/group", data: []byte("root:x:0:\n"), mode: 0o644},
		{name: "tmp/", mode: 0o755}, {name: "root/", mode: 0o700},
	}
	for _, l := range []string{"ld-linux-x86-64.so.2", "libc.so.6", "libpcre2-8.so.0", "libselinux.so.1"} {
		libs = append(libs, ent{name: "usr/lib/x86_64-linux-gnu/" + l, data: read("usr/lib/x86_64-linux-gnu/" + l), mode: 0o755})
	}
	bins := []ent{{name: "usr/bin/sh", link: "dash"}}
	for _, b := range []string{"dash", "grep", "id", "mkdir", "chown", "chmod", "cat", "sync"} {
		bins = append(bins, ent{name: "usr/bin/" + b, data: read("usr/bin/" + b), mode: 0o755})
	}
	mkLayer := func(ents []ent) v1.Layer {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, e := range ents {
			h := &tar.Header{Name: e.name, Mode: e.mode, Size: int64(len(e.data)), Typeflag: tar.TypeReg}
			switch {
			case e.link != "":
				h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, e.link, 0o777
			case strings.HasSuffix(e.name, "/"):
				h.Typeflag = tar.TypeDir
			}
			if err := tw.WriteHeader(h); err != nil {
				t.Fatal(err)
			}
			_, _ = tw.Write(e.data)
		}
		_ = tw.Close()
		b := buf.Bytes()
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	img, err := mutate.AppendLayers(empty.Image, mkLayer(libs), mkLayer(bins))
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config = v1.Config{Env: []string{"PATH=/usr/bin:/bin", "FROM_IMAGE=yes"}, Cmd: []string{"sh"}}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}

	var h http.Handler = registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != "puller" || p != "s3cret" {
			w.Header().Set("WWW-Authenticate", `Basic realm="kiln-test"`)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	ref := strings.TrimPrefix(srv.URL, "http://") + "/mini:v1"
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img, remote.WithAuth(&authn.Basic{Username: "puller", Password: "s3cret"})); err != nil {
		t.Fatal(err)
	}
	return ref
}

// An image from a private registry on loopback becomes a template: its
// layers unpacked, then provisioned (no useradd: uid 1000 user appended to
// /etc/passwd, /tmp 1777); a sandbox of it runs as user with the image's
// env; a rebuild finds everything cached; a wrong password fails the
// build at its base without leaking the password.
func TestBuildFromImage(t *testing.T) {
	ref := miniImage(t)
	e := newEnv(t, "runsc")
	spec := api.TemplateSpec{From: api.TemplateBase{Image: ref, Registry: &api.RegistryAuth{Username: "puller", Password: "s3cret"}},
		Steps: []api.TemplateStep{{Type: api.StepRun, Args: []string{"id -un > /home/user/me; echo $FROM_IMAGE >> /home/user/me", "user"}}}}
	rec, log := e.build("dave", "mini", spec)
	if rec.Status != template.BuildReady {
		t.Fatalf("build: %s %q%s", rec.Status, rec.Reason, lines(log))
	}
	if rec.Spec.From.Registry != nil {
		t.Errorf("the record keeps the registry credentials")
	}
	if len(rec.Layers) != 4 || find(log, "[base] provisioning the image") == "" || find(log, "[1/1] done in") == "" {
		t.Errorf("layers %v (want 2 image layers, provisioning, the step):%s", rec.Layers, lines(log))
	}
	tmpl, err := e.catalog.Resolve(t.Context(), "dave", "mini")
	if err != nil {
		t.Fatal(err)
	}
	box := sandboxtest.Create(t, e.m, sandbox.CreateOptions{TemplateBuild: tmpl, Runtime: "runsc"})
	r := box.Exec(wire.ExecParams{Cwd: box.SB.Workdir, Args: []string{"/bin/sh", "-c",
		`cat /home/user/me; id -u; pwd; test -k /tmp && echo sticky; grep -c '^user:x:1000:1000:' /etc/passwd`}})
	if want := "user\nyes\n1000\n/home/user\nsticky\n1\n"; r.Stdout != want {
		t.Errorf("in a sandbox of the image: %q (stderr %q), want %q", r.Stdout, r.Stderr, want)
	}

	again, log := e.build("dave", "mini", spec)
	if again.Status != template.BuildReady || strings.Join(again.Layers, ",") != strings.Join(rec.Layers, ",") {
		t.Fatalf("rebuild: %s %q %v%s", again.Status, again.Reason, again.Layers, lines(log))
	}
	for _, want := range []string{"[base] layer 1/2", "[base] layer 2/2", "[base] provisioning", "[1/1] RUN"} {
		if !strings.HasSuffix(find(log, want), "CACHED") {
			t.Errorf("rebuild: %q not CACHED:%s", want, lines(log))
		}
	}

	spec.From.Registry.Password = "wrong-password"
	bad, log := e.build("dave", "mini", spec)
	if bad.Status != template.BuildError || !strings.Contains(bad.Reason, "refused the credentials") || bad.Step != -1 {
		t.Errorf("wrong password: %s step %d %q", bad.Status, bad.Step, bad.Reason)
	}
	if strings.Contains(bad.Reason+lines(log), "wrong-password") {
		t.Errorf("the password appears in the reason or log")
	}
}
