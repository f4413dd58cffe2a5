package builder_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
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
			if err != nil && rc.OnDemand {
				// Not built by make setup (e.g. desktop): checked where
				// it is built.
				t.Logf("%s is built on demand and is not built here", name)
				return
			}
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
			if l := find(log, "[base] Debian"); !strings.HasSuffix(l, "CACHED") {
				t.Errorf("%q: want it CACHED%s", l, lines(log))
			}
			runs := 0
			for _, e := range log {
				if !e.Output && runRE.MatchString(e.Message) {
					runs++
					if !strings.HasSuffix(e.Message, "CACHED") {
						t.Errorf("%q: want it CACHED", e.Message)
					}
				}
			}
			if runs == 0 {
				t.Errorf("no RUN step in the log%s", lines(log))
			}
		})
	}
}

var runRE = regexp.MustCompile(`^\[\d+/\d+\] RUN `)

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

// A Debian base that cannot be made (the mirror is unreachable, a package
// does not exist) fails the build at its base, with the tool's own words,
// and leaves nothing: no layer, pending or published, no mount, no
// overlay, no build sandbox.
func TestDebianBaseFailure(t *testing.T) {
	e := newEnvWith(t, "runsc", func(_ *sandbox.Config, b *builder.Config) {
		b.DebianMirror, b.DebianCache = "http://127.0.0.1:1/debian", t.TempDir()
	})
	for _, tc := range []struct {
		name   string
		debian api.DebianBase
		reason string
	}{
		{"debootstrap", api.DebianBase{Suite: "bookworm", Variant: "minbase", Packages: []string{"curl"}}, "base: debootstrap: debootstrap exited with status"},
		// apt-get in an overlay of base's layers (from base's own mirror,
		// or no network at all) finds no such package.
		{"packages on base", api.DebianBase{Template: "base", Packages: []string{"kiln-no-such-package"}}, "base: installing packages: chroot exited with status"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec, log := e.build("", "deb", api.TemplateSpec{From: api.TemplateBase{Debian: &tc.debian},
				Steps: []api.TemplateStep{{Type: api.StepRun, Args: []string{"true"}}}})
			if rec.Status != template.BuildError || !strings.HasPrefix(rec.Reason, tc.reason) || !strings.Contains(rec.Reason, "\n") {
				t.Fatalf("build: %s %q, want it failed at its base (%q) with the tool's output%s", rec.Status, rec.Reason, tc.reason, lines(log))
			}
			if ks := e.storedLayers(); len(ks) != 0 {
				t.Errorf("layers left: %v", ks)
			}
			if tmp, _ := os.ReadDir(filepath.Join(e.dataDir, "layers", "tmp")); len(tmp) != 0 {
				t.Errorf("pending layers left: %v", tmp)
			}
			if _, err := os.Stat(filepath.Join(template.BuildDir(e.dataDir, rec.ID), "debian")); !os.IsNotExist(err) {
				t.Errorf("the overlay's scratch dir is left: %v", err)
			}
			if mi, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mi), e.dataDir) {
				t.Errorf("mounts left under the data dir:\n%s", mi)
			}
			if n := e.liveBuildSandboxes(); n != 0 {
				t.Errorf("%d build sandboxes left", n)
			}
		})
	}
}
