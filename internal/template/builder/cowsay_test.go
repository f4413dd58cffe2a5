package builder_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/network"
	"github.com/kiln-sh/kiln/internal/network/nettest"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/sandbox/sandboxtest"
	"github.com/kiln-sh/kiln/internal/template"
	"github.com/kiln-sh/kiln/internal/template/builder"
	"github.com/kiln-sh/kiln/internal/template/dockerfile"
)

// E2B's custom-package flow at the engine level (issue 17's must-show): a
// Dockerfile FROM code-interpreter that installs a Debian package (the one
// test that reaches the Debian mirror, through the build sandbox's NAT, the
// mirror the built-in templates were bootstrapped from), copies a data file
// and sets ENV and WORKDIR. A sandbox of the template runs cowsay, sees the
// file and the env, and its Python kernel still runs code; a rebuild with
// nothing changed is all CACHED. Both build times go to the test log.
func TestBuildCowsayFromCodeInterpreter(t *testing.T) {
	n := realUplink(t)
	e := newEnvWith(t, "runsc", func(s *sandbox.Config, b *builder.Config) {
		s.Net = n
		b.Network = sandbox.NetworkNAT // RUN apt-get reaches the mirror
		b.BuildTimeout = 20 * time.Minute
	})
	if _, err := e.catalog.Resolve(context.Background(), "", "code-interpreter"); err != nil {
		t.Fatalf("the code-interpreter template is not built (make setup): %v", err)
	}
	dir := t.TempDir()
	for name, data := range map[string]string{
		"data.csv": "x,y\n1,2\n",
		"Dockerfile": `FROM code-interpreter
RUN apt-get update && apt-get install -y --no-install-recommends cowsay
COPY data.csv /home/user/data.csv
ENV GREETING="hello from kiln"
WORKDIR /home/user/work
`,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	spec := e.compileDockerfile("alice", dir)

	first, log := e.buildWithin(20*time.Minute, "alice", "cowsay", spec)
	if first.Status != template.BuildReady {
		t.Fatalf("build: %s %q%s", first.Status, first.Reason, lines(log))
	}
	took := first.FinishedAt.Sub(first.CreatedAt)
	t.Logf("first build: %s", took.Round(time.Millisecond))

	box := sandboxtest.Create(t, e.m, sandbox.CreateOptions{Template: "cowsay", Owner: "alice", Runtime: "runsc"})
	r := box.Exec(wire.ExecParams{Cwd: box.SB.Workdir, User: box.SB.User, Env: box.SB.Env, TimeoutMs: 60_000,
		Args: []string{"/bin/sh", "-c", `/usr/games/cowsay hi && cat /home/user/data.csv && echo "$GREETING" && pwd && id -un`}})
	for _, want := range []string{"< hi >", "(oo)", "x,y\n1,2\n", "hello from kiln\n/home/user/work\nuser\n"} {
		if r.Exit.Code != 0 || !strings.Contains(r.Stdout, want) {
			t.Errorf("in a sandbox of the template: exit %d, %q (stderr %q), want %q in it", r.Exit.Code, r.Stdout, r.Stderr, want)
		}
	}
	if _, res := box.Py("import numpy\nint(numpy.arange(5).sum())"); res != "10" {
		t.Errorf("Python kernel: %q, want 10", res)
	}

	second, log2 := e.buildWithin(5*time.Minute, "alice", "cowsay", spec)
	if second.Status != template.BuildReady || strings.Join(second.Layers, ",") != strings.Join(first.Layers, ",") {
		t.Fatalf("rebuild: %s %q, layers %v want %v%s", second.Status, second.Reason, second.Layers, first.Layers, lines(log2))
	}
	for _, want := range []string{"[1/4] RUN apt-get", "[2/4] COPY"} {
		if m := find(log2, want); !strings.HasSuffix(m, " CACHED") {
			t.Errorf("rebuild: step %q not CACHED:%s", want, lines(log2))
		}
	}
	t.Logf("cached rebuild: %s (first build %s)", second.FinishedAt.Sub(second.CreatedAt).Round(time.Millisecond), took.Round(time.Millisecond))
}

// compileDockerfile compiles dir/Dockerfile and uploads, as owner, the
// files each COPY/ADD step needs, as the client does.
func (e *env) compileDockerfile(owner, dir string) api.TemplateSpec {
	e.t.Helper()
	df, err := os.ReadFile(filepath.Join(dir, "Dockerfile"))
	if err != nil {
		e.t.Fatal(err)
	}
	spec, _, err := dockerfile.Compile(df, dockerfile.Options{IsTemplate: template.ValidName})
	if err != nil {
		e.t.Fatal(err)
	}
	bc, err := dockerfile.OpenContext(dir)
	if err != nil {
		e.t.Fatal(err)
	}
	defer bc.Close()
	if err := bc.HashSteps(spec.Steps); err != nil {
		e.t.Fatal(err)
	}
	for _, st := range spec.Steps {
		if st.FilesHash == "" {
			continue
		}
		p, err := e.b.FilesPath(owner, st.FilesHash)
		if err != nil {
			e.t.Fatal(err)
		}
		_ = os.MkdirAll(filepath.Dir(p), 0o755)
		f, err := os.Create(p)
		if err != nil {
			e.t.Fatal(err)
		}
		if err := bc.WriteTar(f, st.Args[0]); err != nil {
			e.t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			e.t.Fatal(err)
		}
	}
	return *spec
}

// buildWithin is env.build with a deadline of its own, for builds that
// install packages.
func (e *env) buildWithin(d time.Duration, owner, ref string, spec api.TemplateSpec) (template.BuildRecord, []builder.LogEntry) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	rec, err := e.b.Start(ctx, owner, ref, spec, false)
	if err != nil {
		e.t.Fatalf("Start: %v", err)
	}
	if rec, err = e.b.Wait(ctx, rec.ID); err != nil {
		e.t.Fatalf("Wait: %v", err)
	}
	var log []builder.LogEntry
	if err := e.b.Logs(ctx, rec.ID, 0, false, func(le builder.LogEntry) error { log = append(log, le); return nil }); err != nil {
		e.t.Fatalf("Logs: %v", err)
	}
	return rec, log
}

// realUplink is sandbox networking whose host side is a namespace of the
// test's own routed to the real host's network (nettest.RealUplink).
func realUplink(t *testing.T) *network.Network {
	t.Helper()
	n, err := network.New(context.Background(), network.Config{HostNS: nettest.RealUplink(t)},
		slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}
