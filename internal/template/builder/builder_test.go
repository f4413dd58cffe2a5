package builder_test

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/sandbox/sandboxtest"
	"github.com/kiln-sh/kiln/internal/store/sqlite"
	"github.com/kiln-sh/kiln/internal/template"
	"github.com/kiln-sh/kiln/internal/template/builder"
	"github.com/kiln-sh/kiln/internal/template/layer"
)

// agentPath is a kiln-agent built once for the package's tests.
var agentPath string

func TestMain(m *testing.M) { os.Exit(sandboxtest.Main(m, &agentPath)) }

// env is a builder over real sandboxes: its own data dir (whose templates/
// is the real one, for the built-in base), layer store and SQLite store.
type env struct {
	t       *testing.T
	dataDir string
	cfg     builder.Config
	b       *builder.Builder
	m       *sandbox.Manager
	im      *sandbox.Images
	records *sqlite.Store
	layers  *layer.Store
	catalog *template.Catalog
}

func newEnv(t *testing.T, rt string) *env {
	t.Helper()
	return newEnvWith(t, rt, nil)
}

// newEnvWith is newEnv with configure, if not nil, adjusting the configs of
// the Manager and the Builder before they start.
func newEnvWith(t *testing.T, rt string, configure func(*sandbox.Config, *builder.Config)) *env {
	t.Helper()
	scfg := sandboxtest.Config(t, agentPath)
	e := &env{t: t, dataDir: t.TempDir()}
	if err := os.Symlink(template.Dir(scfg.DataDir), template.Dir(e.dataDir)); err != nil {
		t.Fatal(err)
	}
	var err error
	if e.records, err = sqlite.Open(context.Background(), filepath.Join(e.dataDir, "kiln.db")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.records.Close() })
	if e.layers, err = layer.Open(filepath.Join(e.dataDir, "layers")); err != nil {
		t.Fatal(err)
	}
	e.catalog = &template.Catalog{DataDir: e.dataDir, Store: e.records}
	scfg.Catalog = e.catalog
	e.cfg = builder.Config{DataDir: e.dataDir, Records: e.records, Layers: e.layers, Catalog: e.catalog,
		Runtime: rt, Network: sandbox.NetworkNone, BuildTimeout: 5 * time.Minute,
		Log: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))}
	if configure != nil {
		configure(&scfg, &e.cfg)
	}
	e.m, e.im = sandboxtest.NewManagerImages(t, scfg)
	e.cfg.Sandboxes = e.m
	e.b = e.open()
	return e
}

// open starts a Builder on the env's stores (as kiln serve does at start).
func (e *env) open() *builder.Builder {
	e.t.Helper()
	b, err := builder.New(context.Background(), e.cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(b.Close)
	return b
}

// upload stores a gzipped tar of files (name → contents) as owner's upload
// and returns its hash.
func (e *env) upload(owner string, files map[string]string) string {
	e.t.Helper()
	sum := sha256.New()
	for _, n := range sortedKeys(files) {
		sum.Write([]byte(n + "\x00" + files[n] + "\x00"))
	}
	hash := hex.EncodeToString(sum.Sum(nil))
	p, err := e.b.FilesPath(owner, hash)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		e.t.Fatal(err)
	}
	f, err := os.Create(p)
	if err != nil {
		e.t.Fatal(err)
	}
	zw := gzip.NewWriter(f)
	tw := tar.NewWriter(zw)
	for _, n := range sortedKeys(files) {
		_ = tw.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Size: int64(len(files[n])), Typeflag: tar.TypeReg})
		_, _ = tw.Write([]byte(files[n]))
	}
	if err := tw.Close(); err != nil {
		e.t.Fatal(err)
	}
	_ = zw.Close()
	_ = f.Close()
	return hash
}

func sortedKeys(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) }

// build starts a build and waits (3 minutes at most) for its end.
func (e *env) build(owner, ref string, spec api.TemplateSpec) (template.BuildRecord, []builder.LogEntry) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rec, err := e.b.Start(ctx, owner, ref, spec, false)
	if err != nil {
		e.t.Fatalf("Start: %v", err)
	}
	// Follow the log while the build runs: it ends with the build.
	var log []builder.LogEntry
	if err := e.b.Logs(ctx, rec.ID, 0, true, func(le builder.LogEntry) error { log = append(log, le); return nil }); err != nil {
		e.t.Fatalf("Logs: %v", err)
	}
	if rec, err = e.b.Wait(ctx, rec.ID); err != nil {
		e.t.Fatalf("Wait: %v", err)
	}
	return rec, log
}

// lines renders a log for failure messages.
func lines(log []builder.LogEntry) string {
	var b strings.Builder
	for _, le := range log {
		b.WriteString("\n  " + le.Level + " " + le.Message)
	}
	return b.String()
}

// find returns the first log message with prefix.
func find(log []builder.LogEntry, prefix string) string {
	for _, le := range log {
		if strings.HasPrefix(le.Message, prefix) {
			return le.Message
		}
	}
	return ""
}

// liveBuildSandboxes counts the Manager's live build sandboxes.
func (e *env) liveBuildSandboxes() int {
	n := 0
	for _, sb := range e.m.Live() {
		if _, ok := sb.Metadata[builder.MetaBuild]; ok {
			n++
		}
	}
	return n
}

// storedLayers lists the keys in the layer store.
func (e *env) storedLayers() []string {
	ents, _ := os.ReadDir(filepath.Join(e.dataDir, "layers", "layers"))
	var ks []string
	for _, d := range ents {
		ks = append(ks, d.Name())
	}
	return ks
}

// A recipe of JSON steps FROM base (ENV referencing ENV, WORKDIR, RUN as
// root, COPY of an uploaded tar, USER, RUN as that user) builds; a sandbox
// made from the template sees its files, env, user and workdir; a rebuild
// is all CACHED; a changed COPY rebuilds from that step on only.
func TestBuildSteps(t *testing.T) {
	sandboxtest.ForEachRuntime(t, func(t *testing.T, rt string) {
		e := newEnv(t, rt)
		spec := func(data string) api.TemplateSpec {
			return api.TemplateSpec{From: api.TemplateBase{Template: "base"}, Steps: []api.TemplateStep{
				{Type: api.StepEnv, Args: []string{"GREETING", "hello", "MSG", "${GREETING} world"}},
				{Type: api.StepWorkdir, Args: []string{"/opt/app"}},
				{Type: api.StepRun, Args: []string{`echo "$MSG" > made.txt && id -un > who && pwd > where`}},
				{Type: api.StepCopy, Args: []string{"data.txt", "./"}, FilesHash: e.upload("alice", map[string]string{"data.txt": data})},
				{Type: api.StepUser, Args: []string{"user"}},
				{Type: api.StepRun, Args: []string{`id -un > /home/user/who2 && cat /opt/app/data.txt > /home/user/seen`}},
			}}
		}
		rec, log := e.build("alice", "app", spec("v1\n"))
		if rec.Status != template.BuildReady {
			t.Fatalf("build %s: %s %q%s", rec.ID, rec.Status, rec.Reason, lines(log))
		}
		for _, want := range []string{"[1/6] ENV GREETING=hello", "[2/6] WORKDIR /opt/app", "[3/6] RUN echo", "[3/6] done in", "[4/6] COPY data.txt ./", "[6/6] done in", "build " + rec.ID + " ready in"} {
			if find(log, want) == "" {
				t.Errorf("log has no line starting %q:%s", want, lines(log))
			}
		}
		// The base's layers (a built-in's, by its manifest), then one per
		// RUN or COPY step.
		base, err := template.Lookup(e.dataDir, "base")
		if err != nil {
			t.Fatal(err)
		}
		nb := max(len(base.Layers), 1)
		if len(rec.Layers) != nb+3 || !strings.HasPrefix(rec.Layers[0], "builtin:base:") || !strings.HasPrefix(rec.Layers[nb-1], "builtin:base:") {
			t.Errorf("layers = %v, want the base's %d and three steps'", rec.Layers, nb)
		}
		// A sandbox from the template, by name as its owner resolves it.
		tmpl, err := e.catalog.Resolve(context.Background(), "alice", "app")
		if err != nil {
			t.Fatal(err)
		}
		box := sandboxtest.Create(t, e.m, sandbox.CreateOptions{TemplateBuild: tmpl, Runtime: rt})
		if box.SB.User != "user" || box.SB.Workdir != "/opt/app" {
			t.Errorf("sandbox of the template: user %q workdir %q, want user /opt/app", box.SB.User, box.SB.Workdir)
		}
		r := box.Exec(wire.ExecParams{Cwd: box.SB.Workdir, User: box.SB.User, Args: []string{"/bin/sh", "-c",
			`cat made.txt who where data.txt /home/user/who2 /home/user/seen; echo "$GREETING|$MSG"; pwd; id -un`}})
		want := "hello world\nroot\n/opt/app\nv1\nuser\nv1\nhello|hello world\n/opt/app\nuser\n"
		if r.Stdout != want || r.Exit.Code != 0 {
			t.Errorf("in a sandbox of the template: %q (stderr %q), want %q", r.Stdout, r.Stderr, want)
		}

		// These build sandboxes have no network, and the log says so.
		if find(log, "RUN steps have no network") == "" {
			t.Errorf("no warning that RUN steps have no network:%s", lines(log))
		}

		// Nothing changed: every layer step is found again.
		rec2, log2 := e.build("alice", "app", spec("v1\n"))
		if rec2.Status != template.BuildReady || strings.Join(rec2.Layers, ",") != strings.Join(rec.Layers, ",") {
			t.Fatalf("rebuild: %s %q, layers %v want %v%s", rec2.Status, rec2.Reason, rec2.Layers, rec.Layers, lines(log2))
		}
		for _, want := range []string{"[3/6] RUN echo", "[4/6] COPY", "[6/6] RUN id"} {
			if m := find(log2, want); !strings.HasSuffix(m, " CACHED") {
				t.Errorf("rebuild: step %q not CACHED:%s", want, lines(log2))
			}
		}

		// A changed COPY source: the RUN before it is cached, it and the
		// RUN after it are rebuilt.
		rec3, log3 := e.build("alice", "app", spec("v2\n"))
		if rec3.Status != template.BuildReady {
			t.Fatalf("build with a changed file: %s %q%s", rec3.Status, rec3.Reason, lines(log3))
		}
		if !strings.HasSuffix(find(log3, "[3/6] RUN"), " CACHED") || find(log3, "[4/6] done in") == "" || find(log3, "[6/6] done in") == "" {
			t.Errorf("changed COPY: want step 3 CACHED, 4 and 6 rebuilt:%s", lines(log3))
		}
		if rec3.Layers[nb] != rec.Layers[nb] || rec3.Layers[nb+1] == rec.Layers[nb+1] || rec3.Layers[nb+2] == rec.Layers[nb+2] {
			t.Errorf("changed COPY: layers %v, first build's %v", rec3.Layers, rec.Layers)
		}
		tmpl3, err := e.catalog.Resolve(context.Background(), "alice", "app")
		if err != nil || tmpl3.Build != rec3.ID {
			t.Fatalf("app resolves to %v, %v; want build %s", tmpl3, err, rec3.ID)
		}
		// The first sandbox keeps its build's files.
		if r := box.Exec(wire.ExecParams{Args: []string{"cat", "/home/user/seen"}}); r.Stdout != "v1\n" {
			t.Errorf("the first sandbox now sees %q", r.Stdout)
		}
		box3 := sandboxtest.Create(t, e.m, sandbox.CreateOptions{TemplateBuild: tmpl3, Runtime: rt})
		if r := box3.Exec(wire.ExecParams{Args: []string{"cat", "/home/user/seen"}}); r.Stdout != "v2\n" {
			t.Errorf("a sandbox of the new build sees %q", r.Stdout)
		}
		if n := e.liveBuildSandboxes(); n != 0 {
			t.Errorf("%d build sandboxes left running", n)
		}
	})
}
