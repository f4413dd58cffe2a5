package builder_test

import (
	"io"
	"log"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/registry"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/sandbox/sandboxtest"
	"github.com/kiln-sh/kiln/internal/template"
	"github.com/kiln-sh/kiln/internal/template/image"
)

// TestPushTemplate: a template pushed to a registry is a base image
// another template (another server's) builds from: the pushed layers keep
// what its steps wrote (whiteouts and opaque directories: image's
// TestPushRoundTrip), and its config its env, user, workdir and (as the
// image's CMD) start command.
func TestPushTemplate(t *testing.T) {
	ref := miniImage(t)
	e := newEnv(t, "runsc")
	spec := api.TemplateSpec{From: api.TemplateBase{Image: ref, Registry: &api.RegistryAuth{Username: "puller", Password: "s3cret"}},
		Steps: []api.TemplateStep{
			{Type: api.StepRun, Args: []string{"echo pushed > /home/user/mark", "root"}},
			{Type: api.StepEnv, Args: []string{"STAGE", "one"}},
			{Type: api.StepWorkdir, Args: []string{"/home/user"}},
		},
		StartCmd: "sleep 1000",
	}
	rec, logs := e.build("dave", "mini", spec)
	if rec.Status != template.BuildReady {
		t.Fatalf("build: %s %q%s", rec.Status, rec.Reason, lines(logs))
	}
	tmpl, err := e.catalog.Resolve(t.Context(), "dave", "mini")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	pushed := strings.TrimPrefix(srv.URL, "http://") + "/team/mini:v1"
	digest, err := e.b.Push(t.Context(), tmpl, pushed, nil)
	if err != nil || !strings.HasPrefix(digest, "sha256:") {
		t.Fatalf("Push: %q, %v", digest, err)
	}

	again, logs := e.build("erin", "copy", api.TemplateSpec{From: api.TemplateBase{Image: pushed}})
	if again.Status != template.BuildReady {
		t.Fatalf("build from the pushed image: %s %q%s", again.Status, again.Reason, lines(logs))
	}
	copyT, err := e.catalog.Resolve(t.Context(), "erin", "copy")
	if err != nil {
		t.Fatal(err)
	}
	if copyT.Defaults.Workdir != "/home/user" || copyT.Defaults.Env["STAGE"] != "one" || copyT.Defaults.User != "user" {
		t.Errorf("the template built from the pushed image: user %q, workdir %q, env %v", copyT.Defaults.User, copyT.Defaults.Workdir, copyT.Defaults.Env)
	}
	// The start command is the image's CMD (for docker run; a build from
	// the image starts what its own recipe says).
	img, err := image.Pull(t.Context(), pushed, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	if c := img.Config(); c.Cmd != "sleep 1000" || c.User != "user" {
		t.Errorf("the pushed image's config: %+v", c)
	}
	box := sandboxtest.Create(t, e.m, sandbox.CreateOptions{TemplateBuild: copyT, Runtime: "runsc"})
	r := box.Exec(wire.ExecParams{Cwd: box.SB.Workdir, Args: []string{"/bin/sh", "-c",
		`cat /home/user/mark; echo $FROM_IMAGE $STAGE; pwd; id -un`}})
	if want := "pushed\nyes one\n/home/user\nuser\n"; r.Stdout != want {
		t.Errorf("in a sandbox of the pushed image: %q (stderr %q), want %q", r.Stdout, r.Stderr, want)
	}
	if _, err := e.b.Push(t.Context(), tmpl, "", nil); err == nil {
		t.Error("Push to an empty reference succeeded")
	}
}
