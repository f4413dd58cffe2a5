package builder_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/sandbox/sandboxtest"
	"github.com/kiln-sh/kiln/internal/template"
)

// A sandbox created by a custom template's name (resolved for its owner
// through the Catalog; another key cannot) pins that build: when the name
// moves to a new build, a fork of it still has the old build's files, a
// new sandbox the new one's, and deleting the template leaves it running.
func TestSandboxPinsBuild(t *testing.T) {
	e := newEnv(t, "runsc")
	ctx := context.Background()
	spec := func(v string) api.TemplateSpec {
		return api.TemplateSpec{From: api.TemplateBase{Template: "base"}, Steps: []api.TemplateStep{
			{Type: api.StepCopy, Args: []string{"v.txt", "/opt/"}, FilesHash: e.upload("alice", map[string]string{"v.txt": v})},
		}}
	}
	cat := func(b *sandboxtest.Box) string {
		t.Helper()
		return b.Exec(wire.ExecParams{Args: []string{"cat", "/opt/v.txt"}}).Stdout
	}
	v1, log := e.build("alice", "pin", spec("one"))
	if v1.Status != template.BuildReady {
		t.Fatalf("build: %s %q%s", v1.Status, v1.Reason, lines(log))
	}
	box := sandboxtest.Create(t, e.m, sandbox.CreateOptions{Template: "pin", Owner: "alice", Runtime: "runsc"})
	if box.SB.Build != v1.ID || box.SB.Template != "pin" {
		t.Errorf("sandbox of pin: template %q build %q, want pin %s", box.SB.Template, box.SB.Build, v1.ID)
	}
	if rec, err := e.m.Get(ctx, box.SB.ID); err != nil || rec.Build != v1.ID {
		t.Errorf("stored record: build %q, %v", rec.Build, err)
	}
	if got := cat(box); got != "one" {
		t.Errorf("sandbox of pin sees %q", got)
	}
	if _, err := e.m.Create(ctx, sandbox.CreateOptions{Template: "pin", Owner: "bob", Runtime: "runsc"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another key creating from alice's private template: %v, want not found", err)
	}

	if v2, log := e.build("alice", "pin", spec("two")); v2.Status != template.BuildReady {
		t.Fatalf("second build: %s %q%s", v2.Status, v2.Reason, lines(log))
	}
	forks, err := e.im.Fork(ctx, box.SB.ID, 1, sandbox.Quota{})
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	fa, err := e.m.Agent(forks[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	fork := sandboxtest.Wrap(t, e.m, forks[0], fa)
	t.Cleanup(func() { _ = e.m.Kill(context.Background(), forks[0].ID) })
	if forks[0].Build != v1.ID || cat(fork) != "one" {
		t.Errorf("fork after the name moved: build %q sees %q, want %s and one", forks[0].Build, cat(fork), v1.ID)
	}
	box2 := sandboxtest.Create(t, e.m, sandbox.CreateOptions{Template: "pin", Owner: "alice", Runtime: "runsc"})
	if got := cat(box2); got != "two" {
		t.Errorf("a new sandbox of pin sees %q, want two", got)
	}

	if err := e.records.DeleteTag(ctx, "alice", "pin", template.DefaultTag); err != nil {
		t.Fatal(err)
	}
	if err := e.records.DeleteBuild(ctx, v1.ID); err != nil {
		t.Fatal(err)
	}
	// Layer GC keeps what live sandboxes use, whatever the records say.
	if err := e.b.GC(ctx); err != nil {
		t.Fatal(err)
	}
	v1Layer := v1.Layers[len(v1.Layers)-1]
	if !slices.Contains(e.storedLayers(), v1Layer) {
		t.Errorf("GC removed the layer of a build two sandboxes use")
	}
	if got := cat(box); got != "one" {
		t.Errorf("after the template's deletion the sandbox sees %q", got)
	}
	for _, id := range []sandbox.ID{box.SB.ID, forks[0].ID} {
		if err := e.m.Kill(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.b.GC(ctx); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(e.storedLayers(), v1Layer) {
		t.Errorf("GC kept the layer of a deleted build no sandbox uses")
	}
}
