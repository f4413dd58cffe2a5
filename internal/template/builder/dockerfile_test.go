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
	spec := e.compileDockerfile("alice", dir)
	rec, log := e.build("alice", "df", spec)
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
