package server_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/client"
)

// TestTemplateDeleteAndTags: a sandbox outlives the deletion of its
// template; tags move a name between builds; a create by a removed tag is
// not found.
func TestTemplateDeleteAndTags(t *testing.T) {
	h, a, _, _ := templateHarness(t, templateRuntime(), harnessOpts{})
	ctx := testCtx(t)
	spec := api.TemplateSpec{From: api.TemplateBase{Template: "base"},
		Steps: []api.TemplateStep{{Type: api.StepRun, Args: []string{"echo kept > /opt/kept.txt"}}}}
	del := build(t, ctx, a, "del", spec, api.BuildReady)
	delDir := filepath.Join(h.tdata, "builds", del.ID)
	sb := h.create(h.a, api.CreateSandboxRequest{Template: "del", Runtime: templateRuntime()})
	if err := a.DeleteTemplate(ctx, "del"); err != nil {
		t.Fatal(err)
	}
	if got := sh(t, ctx, a, sb.ID, "cat /opt/kept.txt"); got != "kept\n" {
		t.Errorf("sandbox of a deleted template: %q", got)
	}
	if _, err := a.GetTemplate(ctx, "del"); !client.IsCode(err, api.CodeNotFound) {
		t.Errorf("get a deleted template: %v", err)
	}
	if bs, err := a.TemplateBuilds(ctx, "del", 0); err != nil || len(bs) != 0 {
		t.Errorf("builds of a deleted template: %+v, %v", bs, err)
	}
	if _, err := a.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "del", Runtime: templateRuntime()}); !client.IsCode(err, api.CodeNotFound) {
		t.Errorf("create from a deleted template: %v", err)
	}
	if _, err := os.Stat(delDir); err != nil {
		t.Errorf("the build dir of a running sandbox's deleted template: %v", err)
	}
	if err := a.KillSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}

	b1 := build(t, ctx, a, "mv", envSpec("one"), api.BuildReady)
	b2 := build(t, ctx, a, "mv", envSpec("two"), api.BuildReady)
	if got, err := a.GetTemplate(ctx, "mv"); err != nil || got.BuildID != b2.ID {
		t.Fatalf("mv after two builds: %+v, %v", got, err)
	}
	if tm, err := a.TagTemplate(ctx, "mv", "v1", b1.ID); err != nil || tm.BuildID != b1.ID || tm.Tag != "v1" {
		t.Fatalf("tagging v1: %+v, %v", tm, err)
	}
	if got, err := a.GetTemplate(ctx, "mv:v1"); err != nil || got.BuildID != b1.ID || got.Build == nil || got.Build.Tag != "v1" {
		t.Errorf("mv:v1: %+v, %v", got, err)
	}
	bs, err := a.TemplateBuilds(ctx, "mv", 10)
	if err != nil || len(bs) != 2 || bs[0].ID != b2.ID || bs[0].Tag != "default" || bs[1].Tag != "v1" {
		t.Errorf("builds of mv, newest first: %+v, %v", bs, err)
	}
	if tm, err := a.TagTemplate(ctx, "mv", "default", b1.ID); err != nil || tm.BuildID != b1.ID {
		t.Fatalf("moving default back: %+v, %v", tm, err)
	}
	sb2 := h.create(h.a, api.CreateSandboxRequest{Template: "mv", Runtime: templateRuntime()})
	if got := sh(t, ctx, a, sb2.ID, "echo $VALUE"); got != "one\n" {
		t.Errorf("sandbox of mv after re-tagging: %q", got)
	}
	if err := a.UntagTemplate(ctx, "mv", "v1"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "mv:v1", Runtime: templateRuntime()}); !client.IsCode(err, api.CodeNotFound) {
		t.Errorf("create by a removed tag: %v", err)
	}
	if _, err := a.TagTemplate(ctx, "other", "v1", b1.ID); !client.IsCode(err, api.CodeInvalidArgument) || !strings.Contains(err.Error(), "not other") {
		t.Errorf("tagging another template's build: %v", err)
	}
	if err := a.UntagTemplate(ctx, "mv", "v1"); !client.IsCode(err, api.CodeNotFound) {
		t.Errorf("removing a removed tag: %v", err)
	}
	// Deleting a template collects what nothing uses any more: here, also
	// the build dir of "del", whose last sandbox has ended.
	if err := a.DeleteTemplate(ctx, "mv"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(delDir); !os.IsNotExist(err) {
		t.Errorf("the build dir of a deleted template without sandboxes: %v, want it gone", err)
	}
}

// TestTemplateBuildFailure: a RUN that exits 1 fails the build with a
// reason naming the step and carrying its output; the name keeps its
// previous good build.
func TestTemplateBuildFailure(t *testing.T) {
	h, a, _, _ := templateHarness(t, templateRuntime(), harnessOpts{})
	ctx := testCtx(t)
	good := build(t, ctx, a, "flaky", envSpec("good"), api.BuildReady)
	before := metricValue(metricsText(t, h), `kiln_template_builds_total{status="error"}`)
	bad := api.TemplateSpec{From: api.TemplateBase{Template: "base"},
		Steps: []api.TemplateStep{{Type: api.StepEnv, Args: []string{"VALUE", "bad"}}, {Type: api.StepRun, Args: []string{"echo oops-output; exit 1"}}}}
	failed := build(t, ctx, a, "flaky", bad, api.BuildError)
	if !strings.Contains(failed.Reason, "step 2 (RUN)") || !strings.Contains(failed.Reason, "oops-output") {
		t.Errorf("reason %q: want the step and the tail of its output", failed.Reason)
	}
	es := logOf(t, ctx, a, failed.ID)
	var printed bool
	for _, e := range es {
		printed = printed || e.Output && e.Step == 1 && strings.Contains(e.Message, "oops-output")
	}
	if !printed || es[len(es)-1].Level != "error" {
		t.Errorf("log of the failed build: %+v", es)
	}
	if got, err := a.GetTemplate(ctx, "flaky"); err != nil || got.BuildID != good.ID {
		t.Errorf("flaky after a failed build: %+v, %v (want build %s)", got, err, good.ID)
	}
	sb := h.create(h.a, api.CreateSandboxRequest{Template: "flaky", Runtime: templateRuntime()})
	if got := sh(t, ctx, a, sb.ID, "echo $VALUE"); got != "good\n" {
		t.Errorf("sandbox of flaky after a failed build: %q", got)
	}
	m := metricsText(t, h)
	if after := metricValue(m, `kiln_template_builds_total{status="error"}`); after != before+1 {
		t.Errorf("builds with status error: %v, then %v", before, after)
	}
	// A command that exits non-zero is a failed precondition of the build.
	if metricValue(m, `kiln_template_build_failures_total{class="failed_precondition"}`) != 1 {
		t.Errorf("the failure is not counted:\n%s", grepLines(m, "kiln_template_build_failures_total"))
	}
}

// grepLines keeps the lines of text that contain s.
func grepLines(text, s string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
