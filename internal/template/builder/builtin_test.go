package builder_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/sandbox/sandboxtest"
	"github.com/kiln-sh/kiln/internal/store/sqlite"
	"github.com/kiln-sh/kiln/internal/template"
	"github.com/kiln-sh/kiln/internal/template/builder"
	"github.com/kiln-sh/kiln/internal/template/layer"
)

// The built-in templates are builds of this engine (one path): each is a
// stack of layers in the built-ins' layer store, and building its recipe
// again finds every layer in the cache (so no mirror is needed: this
// one is unreachable) and the same published build.
func TestBuiltinsAreEngineBuilds(t *testing.T) {
	scfg := sandboxtest.Config(t, agentPath)
	records, err := sqlite.Open(context.Background(), sqlite.Memory)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { records.Close() })
	layers, err := layer.Open(template.BuiltinLayers(scfg.DataDir))
	if err != nil {
		t.Fatal(err)
	}
	m, _ := sandboxtest.NewManagerImages(t, scfg)
	b, err := builder.New(context.Background(), builder.Config{
		DataDir: t.TempDir(), Records: records, Layers: layers, Catalog: &template.Catalog{DataDir: scfg.DataDir},
		Sandboxes: m, Network: sandbox.NetworkNone, DebianMirror: "http://127.0.0.1:1/debian",
		Log: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	for name, rc := range template.Builtin() {
		t.Run(name, func(t *testing.T) {
			want, err := template.Lookup(scfg.DataDir, name)
			if err != nil {
				t.Fatalf("the built-in is not built (make setup): %v", err)
			}
			if len(want.Layers) < 2 {
				t.Fatalf("%s has layers %v: want the Debian base and the recipe's steps", name, want.Layers)
			}
			for _, dir := range want.Layers {
				if !strings.HasPrefix(dir, template.BuiltinLayers(scfg.DataDir)+string(filepath.Separator)) {
					t.Errorf("layer %s is not in the built-ins' layer store", dir)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var log []builder.LogEntry
			got, existed, err := b.BuildBuiltin(ctx, rc, false, func(e builder.LogEntry) { log = append(log, e) })
			if err != nil {
				t.Fatalf("rebuilding %s: %v%s", name, err, lines(log))
			}
			if !existed || got.Hash != want.Hash || template.Lower(got.Layers) != template.Lower(want.Layers) {
				t.Errorf("rebuilt %s: existed=%v hash %s, want the published %s", name, existed, got.Hash, want.Hash)
			}
			if got.Defaults.User != "user" || got.Defaults.Workdir != "/home/user" || got.Defaults.Env["LANG"] != "C.UTF-8" {
				t.Errorf("defaults %+v: want user in /home/user with LANG", got.Defaults)
			}
			for _, prefix := range []string{"[base] Debian", "[1/"} {
				if l := find(log, prefix); !strings.HasSuffix(l, "CACHED") {
					t.Errorf("%q: want it CACHED%s", l, lines(log))
				}
			}
		})
	}
}

// A server's builder (no DebianMirror) refuses a Debian base: debootstrap
// and package scripts would run as root on the host.
func TestDebianBaseRefusedByServers(t *testing.T) {
	e := newEnv(t, "runsc")
	_, err := e.b.Start(context.Background(), "alice", "deb", api.TemplateSpec{
		From: api.TemplateBase{Debian: &api.DebianBase{Suite: "bookworm", Variant: "minbase"}}}, false)
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "from.debian") {
		t.Fatalf("Start = %v, want invalid argument naming from.debian", err)
	}
	if builds, _ := e.b.List(context.Background(), "alice", "", 10); len(builds) != 0 {
		t.Errorf("a refused build was recorded: %+v", builds)
	}
}

// A Debian base that cannot be made (the mirror is unreachable) fails the
// build at its base, with debootstrap's own words, and leaves nothing:
// no layer, pending or published, no mount, no build sandbox.
func TestDebianBaseFailure(t *testing.T) {
	e := newEnvWith(t, "runsc", func(_ *sandbox.Config, b *builder.Config) {
		b.DebianMirror, b.DebianCache = "http://127.0.0.1:1/debian", t.TempDir()
	})
	rec, log := e.build("", "deb", api.TemplateSpec{
		From:  api.TemplateBase{Debian: &api.DebianBase{Suite: "bookworm", Variant: "minbase", Packages: []string{"curl"}}},
		Steps: []api.TemplateStep{{Type: api.StepRun, Args: []string{"true"}}}})
	if rec.Status != template.BuildError || !strings.HasPrefix(rec.Reason, "base: debootstrap: debootstrap exited with status") ||
		!strings.Contains(rec.Reason, "127.0.0.1:1") {
		t.Fatalf("build: %s %q, want it failed at its base with debootstrap's output%s", rec.Status, rec.Reason, lines(log))
	}
	if ks := e.storedLayers(); len(ks) != 0 {
		t.Errorf("layers left: %v", ks)
	}
	if tmp, _ := os.ReadDir(filepath.Join(e.dataDir, "layers", "tmp")); len(tmp) != 0 {
		t.Errorf("pending layers left: %v", tmp)
	}
	if mi, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mi), filepath.Join(e.dataDir, "layers")) {
		t.Errorf("mounts left under the layer store:\n%s", mi)
	}
	if n := e.liveBuildSandboxes(); n != 0 {
		t.Errorf("%d build sandboxes left", n)
	}
}
