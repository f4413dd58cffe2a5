package builder_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/sandbox/sandboxtest"
	"github.com/kiln-sh/kiln/internal/template"
)

// A template whose start command runs a web server and whose ready
// command waits for its port is snapshotted running: a sandbox created
// from it answers HTTP at once, the server restored, not started. A ready
// command that never succeeds fails the build at its end, leaving the
// name on its earlier build and no manifest.
func TestBuildWarmWebServer(t *testing.T) {
	e := newEnv(t, "runsc")
	e.cfg.Images, e.cfg.ReadyTimeout = e.im, 5*time.Second
	e.b = e.open()
	spec := api.TemplateSpec{From: api.TemplateBase{Template: "base"},
		Steps:    []api.TemplateStep{{Type: api.StepRun, Args: []string{"mkdir -p /srv/www && echo warm-page > /srv/www/index.html"}}},
		StartCmd: "cd /srv/www && exec python3 -m http.server 8080",
		ReadyCmd: "echo > /dev/tcp/127.0.0.1/8080"}
	rec, log := e.build("web", "site", spec)
	if rec.Status != template.BuildReady || find(log, "[finalize] warm snapshot taken") == "" {
		t.Fatalf("build: %s %q%s", rec.Status, rec.Reason, lines(log))
	}
	get := func(build string) {
		t.Helper()
		box := sandboxtest.Create(t, e.m, sandbox.CreateOptions{Template: "site", Owner: "web", Runtime: "runsc"})
		if box.SB.Build != build {
			t.Errorf("sandbox of build %s, want %s", box.SB.Build, build)
		}
		r := box.Exec(wire.ExecParams{Args: []string{"bash", "-c",
			`exec 3<>/dev/tcp/127.0.0.1/8080 && printf 'GET /index.html HTTP/1.0\r\n\r\n' >&3 && cat <&3 | sed -n '1p;$p'`}})
		if !strings.HasPrefix(r.Stdout, "HTTP/1.0 200") || !strings.HasSuffix(r.Stdout, "warm-page\n") {
			t.Errorf("the template's web server: %q (stderr %q)", r.Stdout, r.Stderr)
		}
	}
	get(rec.ID)

	// A rebuild that changes nothing reuses the snapshot: the template is
	// not started again, and its sandboxes are restored from it all the same.
	again, log := e.build("web", "site", spec)
	if again.Status != template.BuildReady || find(log, "[finalize] reusing the warm snapshot of build "+rec.ID) == "" ||
		find(log, "[finalize] start ") != "" {
		t.Fatalf("rebuild: %s %q: want the snapshot of %s reused%s", again.Status, again.Reason, rec.ID, lines(log))
	}
	t.Logf("first build %s, unchanged rebuild %s", rec.FinishedAt.Sub(rec.CreatedAt).Round(time.Millisecond),
		again.FinishedAt.Sub(again.CreatedAt).Round(time.Millisecond))
	get(again.ID)

	spec.ReadyCmd = "false"
	bad, log := e.build("web", "site", spec)
	if bad.Status != template.BuildError || bad.Step != -1 ||
		!strings.HasPrefix(bad.Reason, `finalize: the ready command "false" did not succeed within 5s`) {
		t.Errorf("never ready: %s step %d %q%s", bad.Status, bad.Step, bad.Reason, lines(log))
	}
	if _, err := os.Stat(filepath.Join(template.BuildDir(e.dataDir, bad.ID), "template.json")); !os.IsNotExist(err) {
		t.Errorf("a failed build's manifest is left: %v", err)
	}
	if tmpl, err := e.catalog.Resolve(context.Background(), "web", "site"); err != nil || tmpl.Build != again.ID {
		t.Errorf("site resolves to %v, %v; want the latest good build %s", tmpl, err, again.ID)
	}
}
