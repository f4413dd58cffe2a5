package builder_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/sandbox/sandboxtest"
	"github.com/kiln-sh/kiln/internal/template"
	"github.com/kiln-sh/kiln/internal/template/builder"
)

// A RUN that exits non-zero ends the build in error naming the step, with
// the tail of its output; no layer, build sandbox or mount is left, and
// the name keeps serving its earlier good build. A COPY of a file never
// uploaded fails naming its step.
func TestBuildFailure(t *testing.T) {
	e := newEnv(t, "runsc")
	good, log := e.build("bob", "svc", api.TemplateSpec{From: api.TemplateBase{Template: "base"},
		Steps: []api.TemplateStep{{Type: api.StepEnv, Args: []string{"V", "1"}}}})
	if good.Status != template.BuildReady {
		t.Fatalf("good build: %s %q%s", good.Status, good.Reason, lines(log))
	}
	before := e.storedLayers()

	bad, log := e.build("bob", "svc", api.TemplateSpec{From: api.TemplateBase{Template: "base"}, Steps: []api.TemplateStep{
		{Type: api.StepRun, Args: []string{"echo kept > /kept"}},
		{Type: api.StepRun, Args: []string{"for i in $(seq 1 40); do echo line$i; done; echo 'E: Unable to locate package nosuch' >&2; exit 3"}},
	}})
	if bad.Status != template.BuildError || bad.Step != 1 {
		t.Fatalf("failing build: status %s step %d reason %q", bad.Status, bad.Step, bad.Reason)
	}
	for _, want := range []string{"step 2 (RUN): the command exited with status 3", "E: Unable to locate package nosuch", "line40"} {
		if !strings.Contains(bad.Reason, want) {
			t.Errorf("reason %q does not contain %q", bad.Reason, want)
		}
	}
	if strings.Contains(bad.Reason, "line1\n") {
		t.Errorf("reason carries the whole output, want its tail: %q", bad.Reason)
	}
	if m := find(log, "build failed: step 2 (RUN)"); m == "" {
		t.Errorf("log does not say the build failed:%s", lines(log))
	}
	if after := e.storedLayers(); strings.Join(after, ",") != strings.Join(before, ",") {
		t.Errorf("layers after the failed build: %v, before it %v", after, before)
	}
	if n := e.liveBuildSandboxes(); n != 0 {
		t.Errorf("%d build sandboxes left running", n)
	}
	if mounts, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mounts), e.dataDir) {
		t.Errorf("mounts left under the data dir:\n%s", mounts)
	}
	tmpl, err := e.catalog.Resolve(context.Background(), "bob", "svc")
	if err != nil || tmpl.Build != good.ID {
		t.Errorf("svc resolves to %v, %v; want the good build %s", tmpl, err, good.ID)
	}

	missing, log := e.build("bob", "svc", api.TemplateSpec{From: api.TemplateBase{Template: "base"}, Steps: []api.TemplateStep{
		{Type: api.StepCopy, Args: []string{"data.csv", "/data/"}, FilesHash: strings.Repeat("ab", 32), Line: 4},
	}})
	if missing.Status != template.BuildError || !strings.Contains(missing.Reason, "step 1 (COPY, Dockerfile line 4): the files of data.csv") {
		t.Errorf("COPY of a missing upload: %s %q%s", missing.Status, missing.Reason, lines(log))
	}
	unknown, _ := e.build("bob", "svc", api.TemplateSpec{From: api.TemplateBase{Template: "nosuch"}})
	if unknown.Status != template.BuildError || !strings.HasPrefix(unknown.Reason, "base: template nosuch") || unknown.Step != -1 {
		t.Errorf("unknown base: %s step %d %q", unknown.Status, unknown.Step, unknown.Reason)
	}
}

// A build that kiln serve was running when it died is failed by the next
// start (New on the same stores), which kills the build sandbox it left.
func TestBuildRestart(t *testing.T) {
	e := newEnv(t, "runsc")
	ctx := context.Background()
	rec := template.BuildRecord{ID: "bleftover0000000000000001", Template: "web", Owner: "carol",
		Status: template.BuildBuilding, Step: 2, CreatedAt: time.Now().UTC(),
		Spec: api.TemplateSpec{From: api.TemplateBase{Template: "base"}}}
	if err := e.records.PutBuild(ctx, rec); err != nil {
		t.Fatal(err)
	}
	// Another cluster node's build, running there: not this start's.
	theirs := rec
	theirs.ID, theirs.Node = "belsewhere00000000000001", "node-elsewhere"
	if err := e.records.PutBuild(ctx, theirs); err != nil {
		t.Fatal(err)
	}
	// The build sandbox the dead server was running the step in.
	base, err := e.catalog.Resolve(ctx, "", "base")
	if err != nil {
		t.Fatal(err)
	}
	left, err := e.m.Create(ctx, sandbox.CreateOptions{TemplateBuild: base, Runtime: "runsc",
		Metadata: map[string]string{builder.MetaBuild: rec.ID}})
	if err != nil {
		t.Fatal(err)
	}
	e.open()
	got, err := e.records.GetBuild(ctx, rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != template.BuildError || got.Reason != "interrupted by a restart of kiln serve" || got.FinishedAt.IsZero() {
		t.Errorf("after a restart the build is %s %q (finished %v)", got.Status, got.Reason, got.FinishedAt)
	}
	if got, err := e.records.GetBuild(ctx, theirs.ID); err != nil || got.Status != template.BuildBuilding {
		t.Errorf("another node's build after this one's restart: %+v, %v; want it still building", got, err)
	}
	if sb, err := e.m.Get(ctx, left.ID); err != nil || sb.State == sandbox.StateRunning {
		t.Errorf("the leftover build sandbox: %s, %v; want it killed", sb.State, err)
	}
	if n := e.liveBuildSandboxes(); n != 0 {
		t.Errorf("%d build sandboxes left running", n)
	}
}

// Builds over the per-key or total limit are refused with
// resource_exhausted; closing the builder fails a running build and kills
// its sandbox; its log stays readable from any offset.
func TestBuildLimitsAndClose(t *testing.T) {
	e := newEnv(t, "runsc")
	e.cfg.MaxPerOwner, e.cfg.MaxConcurrent = 1, 1
	b := e.open()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	slow, err := b.Start(ctx, "erin", "slow", api.TemplateSpec{From: api.TemplateBase{Template: "base"},
		Steps: []api.TemplateStep{{Type: api.StepRun, Args: []string{"echo started; sleep 300"}}}}, false)
	if err != nil {
		t.Fatal(err)
	}
	errSeen := errors.New("seen")
	err = b.Logs(ctx, slow.ID, 0, true, func(le builder.LogEntry) error {
		if le.Message == "started" {
			return errSeen
		}
		return nil
	})
	if !errors.Is(err, errSeen) {
		t.Fatalf("following the log until the step's output: %v", err)
	}
	cheap := api.TemplateSpec{From: api.TemplateBase{Template: "base"}}
	if _, err := b.Start(ctx, "erin", "other", cheap, false); !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "for this key") {
		t.Errorf("a second build of the key: %v, want resource_exhausted", err)
	}
	if _, err := b.Start(ctx, "frank", "other", cheap, false); !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "this server allows") {
		t.Errorf("a build over the total: %v, want resource_exhausted", err)
	}
	if n := e.liveBuildSandboxes(); n != 1 {
		t.Errorf("%d build sandboxes while the step runs, want 1", n)
	}
	b.Close()
	got, err := b.Get(ctx, slow.ID)
	if err != nil || got.Status != template.BuildError || !strings.HasPrefix(got.Reason, "step 1 (RUN): kiln serve stopped during the build") {
		t.Errorf("after Close: %s %q, %v", got.Status, got.Reason, err)
	}
	if n := e.liveBuildSandboxes(); n != 0 {
		t.Errorf("%d build sandboxes left after Close", n)
	}
	if _, err := b.Start(ctx, "frank", "other", cheap, false); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("Start after Close: %v, want unavailable", err)
	}
	var all, tail []builder.LogEntry
	_ = b.Logs(ctx, slow.ID, 0, false, func(le builder.LogEntry) error { all = append(all, le); return nil })
	_ = b.Logs(ctx, slow.ID, 2, true, func(le builder.LogEntry) error { tail = append(tail, le); return nil })
	if len(all) < 4 || len(tail) != len(all)-2 || tail[0].Message != all[2].Message ||
		!strings.HasPrefix(all[len(all)-1].Message, "build failed: step 1 (RUN)") || all[len(all)-1].Level != "error" || all[len(all)-1].Step != 0 {
		t.Errorf("log after the end: %d entries, from offset 2: %d%s", len(all), len(tail), lines(all))
	}
}

// A RUN step that fills the build sandbox's disk (its writable layer is
// MaxLayerBytes, an ext4 image of that size) ends the build in error
// naming the step, with the command's own "No space left on device" in
// the reason; nothing is left: no layer (published or pending), no build
// sandbox, no mount, nothing in the build's dir but its log; the name keeps
// serving its earlier good build.
func TestBuildDiskFull(t *testing.T) {
	sandboxtest.ForEachRuntime(t, func(t *testing.T, rt string) {
		e := newEnvWith(t, rt, func(_ *sandbox.Config, c *builder.Config) { c.MaxLayerBytes = 64 << 20 })
		good, log := e.build("dora", "big", api.TemplateSpec{From: api.TemplateBase{Template: "base"},
			Steps: []api.TemplateStep{{Type: api.StepRun, Args: []string{"echo small > /small"}}}})
		if good.Status != template.BuildReady {
			t.Fatalf("good build: %s %q%s", good.Status, good.Reason, lines(log))
		}
		before := e.storedLayers()

		full, log := e.build("dora", "big", api.TemplateSpec{From: api.TemplateBase{Template: "base"}, Steps: []api.TemplateStep{
			{Type: api.StepEnv, Args: []string{"A", "1"}},
			{Type: api.StepRun, Args: []string{"dd if=/dev/zero of=/big bs=1M count=200"}},
		}})
		if full.Status != template.BuildError || full.Step != 1 {
			t.Fatalf("disk-filling build: status %s step %d reason %q%s", full.Status, full.Step, full.Reason, lines(log))
		}
		for _, want := range []string{"step 2 (RUN): the command exited with status 1", "No space left on device"} {
			if !strings.Contains(full.Reason, want) {
				t.Errorf("reason %q does not contain %q", full.Reason, want)
			}
		}
		if after := e.storedLayers(); strings.Join(after, ",") != strings.Join(before, ",") {
			t.Errorf("layers after the failed build: %v, before it %v", after, before)
		}
		if pending, _ := os.ReadDir(filepath.Join(e.dataDir, "layers", "tmp")); len(pending) != 0 {
			t.Errorf("%d pending layers left in the layer store's tmp dir", len(pending))
		}
		if n := e.liveBuildSandboxes(); n != 0 {
			t.Errorf("%d build sandboxes left running", n)
		}
		if mounts, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mounts), e.dataDir) {
			t.Errorf("mounts left under the data dir:\n%s", mounts)
		}
		if ents, err := os.ReadDir(template.BuildDir(e.dataDir, full.ID)); err != nil || len(ents) != 1 || ents[0].Name() != "build.log" {
			t.Errorf("the failed build's dir holds %v (%v), want its log only", ents, err)
		}
		tmpl, err := e.catalog.Resolve(context.Background(), "dora", "big")
		if err != nil || tmpl.Build != good.ID {
			t.Fatalf("big resolves to %v, %v; want the good build %s", tmpl, err, good.ID)
		}
		box := sandboxtest.Create(t, e.m, sandbox.CreateOptions{TemplateBuild: tmpl, Runtime: rt})
		if r := box.Exec(wire.ExecParams{Args: []string{"cat", "/small"}}); r.Stdout != "small\n" {
			t.Errorf("a sandbox of the good build reads %q (stderr %q)", r.Stdout, r.Stderr)
		}
	})
}
