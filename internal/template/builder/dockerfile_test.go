package builder_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/sandbox/sandboxtest"
	"github.com/kiln-sh/kiln/internal/template"
	"github.com/kiln-sh/kiln/internal/template/dockerfile"
)

// A Dockerfile compiled by the front end, its context uploaded as the
// client does, builds: ENV that extends the base's PATH and references
// an earlier ENV, ARG in RUN, COPY with --chown into the WORKDIR, USER.
func TestBuildDockerfile(t *testing.T) {
	e := newEnv(t, "runsc")
	dir := t.TempDir()
	for name, data := range map[string]string{
		"hello.sh":      "#!/bin/sh\necho \"hello from $APP_HOME as $(id -un)\"\n",
		"notes.txt":     "kept\n",
		"secret.txt":    "ignored\n",
		".dockerignore": "secret.txt\n",
		"Dockerfile": `FROM base
ARG GREETING=hi
ENV APP_HOME=/opt/app
ENV PATH=$APP_HOME/bin:$PATH
WORKDIR $APP_HOME
COPY --chown=user:user --chmod=755 hello.sh bin/hello
COPY *.txt ./
RUN echo "$GREETING" > greeting && ls > listing
USER user
`,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	df, _ := os.ReadFile(filepath.Join(dir, "Dockerfile"))
	spec, _, err := dockerfile.Compile(df, dockerfile.Options{IsTemplate: template.ValidName})
	if err != nil {
		t.Fatal(err)
	}
	bc, err := dockerfile.OpenContext(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer bc.Close()
	if err := bc.HashSteps(spec.Steps); err != nil {
		t.Fatal(err)
	}
	for _, st := range spec.Steps {
		if st.FilesHash == "" {
			continue
		}
		p, err := e.b.FilesPath("alice", st.FilesHash)
		if err != nil {
			t.Fatal(err)
		}
		_ = os.MkdirAll(filepath.Dir(p), 0o755)
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := bc.WriteTar(f, st.Args[0]); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	rec, log := e.build("alice", "df", *spec)
	if rec.Status != template.BuildReady {
		t.Fatalf("build: %s %q%s", rec.Status, rec.Reason, lines(log))
	}
	tmpl, err := e.catalog.Resolve(context.Background(), "alice", "df")
	if err != nil {
		t.Fatal(err)
	}
	if got := tmpl.Defaults.Env["PATH"]; !strings.HasPrefix(got, "/opt/app/bin:/usr/local/sbin:") {
		t.Errorf("PATH = %q, want /opt/app/bin before the default", got)
	}
	box := sandboxtest.Create(t, e.m, sandbox.CreateOptions{Template: "df", Owner: "alice", Runtime: "runsc"})
	r := box.Exec(wire.ExecParams{Cwd: box.SB.Workdir, User: box.SB.User, Env: box.SB.Env, Args: []string{"/bin/sh", "-c",
		`hello && cat greeting listing && stat -c '%U %a' bin/hello`}})
	want := "hello from /opt/app as user\nhi\nbin\ngreeting\nlisting\nnotes.txt\nuser 755\n" // no secret.txt: .dockerignore
	if r.Stdout != want {
		t.Errorf("in a sandbox of the Dockerfile's template: %q (stderr %q), want %q", r.Stdout, r.Stderr, want)
	}
}
