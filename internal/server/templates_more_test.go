package server_test

import (
	"bytes"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/client"
	"github.com/kiln-sh/kiln/internal/config"
)

// envSpec is a recipe with no RUN step: it builds without a sandbox.
func envSpec(value string) api.TemplateSpec {
	return api.TemplateSpec{From: api.TemplateBase{Template: "base"},
		Steps: []api.TemplateStep{{Type: api.StepEnv, Args: []string{"VALUE", value}}}}
}

// TestTemplateDockerfile builds from a Dockerfile through
// client.BuildDockerfile: a COPY of a context file, ENV and WORKDIR.
func TestTemplateDockerfile(t *testing.T) {
	h, a, _, _ := templateHarness(t, templateRuntime(), harnessOpts{})
	ctx := testCtx(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "data.txt"), []byte("from-the-context\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	df := "FROM base\nENV APP_MODE=prod\nWORKDIR /app\nCOPY data.txt ./\nRUN cp data.txt copied.txt\nEXPOSE 80\n"
	var warnings []string
	b, err := a.BuildDockerfile(ctx, client.DockerfileBuild{Template: "df:v1", Dockerfile: df, ContextDir: dir,
		OnWarning: func(w string) { warnings = append(warnings, w) }})
	if err != nil {
		t.Fatal(err)
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], "Dockerfile:6") {
		t.Errorf("warnings %q, want one about EXPOSE on line 6", warnings)
	}
	if b, err = a.WaitTemplateBuild(ctx, b.ID); err != nil || b.Status != api.BuildReady {
		t.Fatalf("build: %+v, %v", b, err)
	}
	if hash := b.Spec.Steps[2].FilesHash; hash == "" {
		t.Error("the COPY step has no files hash")
	} else if ok, err := a.TemplateFilesExist(ctx, hash); !ok || err != nil {
		t.Errorf("the COPY's files are not on the server: %v, %v", ok, err)
	}
	sb := h.create(h.a, api.CreateSandboxRequest{Template: "df:v1", Runtime: templateRuntime()})
	if got := sh(t, ctx, a, sb.ID, "cat data.txt copied.txt; echo $APP_MODE; pwd"); got != "from-the-context\nfrom-the-context\nprod\n/app\n" {
		t.Errorf("sandbox of the Dockerfile's template: %q", got)
	}
}

// TestTemplateTenancy: another key can neither see nor use nor change a
// private template; once public it can see and use it, not change it.
func TestTemplateTenancy(t *testing.T) {
	h, a, b, admin := templateHarness(t, templateRuntime(), harnessOpts{})
	ctx := testCtx(t)
	bl := build(t, ctx, a, "priv", envSpec("secret"), api.BuildReady)

	notFound := func(what string, err error) {
		t.Helper()
		if !client.IsCode(err, api.CodeNotFound) {
			t.Errorf("%s by another key: %v, want not_found", what, err)
		}
	}
	_, err := b.GetTemplate(ctx, "priv")
	notFound("get", err)
	_, err = b.TemplateBuild(ctx, bl.ID)
	notFound("get build", err)
	notFound("logs", b.TemplateBuildLogs(ctx, bl.ID, 0, false, func(api.TemplateLogEntry) error { return nil }))
	_, err = b.StartTemplateBuild(ctx, api.TemplateBuildRequest{Template: "mine", Spec: api.TemplateSpec{From: api.TemplateBase{Template: "priv"}}})
	notFound("build FROM", err)
	_, err = b.TagTemplate(ctx, "priv", "v2", bl.ID)
	notFound("tag", err)
	notFound("delete", b.DeleteTemplate(ctx, "priv"))
	notFound("untag", b.UntagTemplate(ctx, "priv", "default"))
	_, err = b.SetTemplatePublic(ctx, "priv", true)
	notFound("publish", err)
	_, err = b.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "priv", Runtime: templateRuntime()})
	notFound("create a sandbox from", err)
	if names := templateNames(t, b); strings.Contains(names, "priv") || !strings.Contains(names, "base:default") {
		t.Errorf("another key lists %s", names)
	}
	if names := templateNames(t, admin); !strings.Contains(names, "priv:default") {
		t.Errorf("an admin lists %s", names)
	}

	pub, err := a.SetTemplatePublic(ctx, "priv", true)
	if err != nil || !pub.Public || pub.Build == nil || pub.Build.ID != bl.ID {
		t.Fatalf("publishing: %+v, %v", pub, err)
	}
	if got, err := b.GetTemplate(ctx, "priv"); err != nil || got.BuildID != bl.ID {
		t.Errorf("get a public template by another key: %+v, %v", got, err)
	}
	if names := templateNames(t, b); !strings.Contains(names, "priv:default") {
		t.Errorf("another key lists %s, without the public template", names)
	}
	sb, err := b.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "priv", Runtime: templateRuntime()})
	if err != nil {
		t.Fatalf("a sandbox of a public template by another key: %v", err)
	}
	if got := sh(t, ctx, b, sb.ID, "echo $VALUE"); got != "secret\n" {
		t.Errorf("sandbox of the public template: %q", got)
	}
	forbidden := func(what string, err error) {
		t.Helper()
		if !client.IsCode(err, api.CodePermissionDenied) {
			t.Errorf("%s of a public template by another key: %v, want permission_denied", what, err)
		}
	}
	forbidden("delete", b.DeleteTemplate(ctx, "priv"))
	_, err = b.SetTemplatePublic(ctx, "priv", false)
	forbidden("unpublish", err)
	forbidden("delete the built-in", b.DeleteTemplate(ctx, "base"))
	mine := build(t, ctx, b, "mine", api.TemplateSpec{From: api.TemplateBase{Template: "priv"}}, api.BuildReady)
	if mine.Owner == bl.Owner {
		t.Errorf("the other key's build is owned by %s, the first key", mine.Owner)
	}
	if err := admin.DeleteTemplate(ctx, "priv"); err != nil {
		t.Errorf("an admin deleting a key's template: %v", err)
	}
	_, err = a.GetTemplate(ctx, "priv")
	notFound("get after an admin deleted it", err)
	_ = h
}

// templateNames lists "name:tag" of the templates c can see.
func templateNames(t *testing.T, c *client.Client) string {
	t.Helper()
	ts, err := c.ListTemplates(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tm := range ts {
		names = append(names, tm.Name+":"+tm.Tag)
	}
	return strings.Join(names, " ")
}

// TestTemplateLimits: builds over the per-key limit and uploads over the
// context limit are refused, as is bad input, with clear messages.
func TestTemplateLimits(t *testing.T) {
	h, a, b, _ := templateHarness(t, templateRuntime(), harnessOpts{builds: config.Builds{MaxPerKey: 1, MaxContextBytes: 4096}})
	ctx := testCtx(t)

	hash := strings.Repeat("ab", 32)
	resp := h.request("PUT", "/v1/templates/files/"+hash, h.a, bytes.NewReader(make([]byte, 5000)))
	if e := apiErr(t, resp); resp.StatusCode != http.StatusRequestEntityTooLarge || e.Code != api.CodeResourceExhausted || !strings.Contains(e.Message, "4096") {
		t.Errorf("upload over the limit: %d %+v", resp.StatusCode, e)
	}
	// Streamed, without a length: bounded while it is read.
	resp = h.request("PUT", "/v1/templates/files/"+hash, h.a, struct{ *bytes.Reader }{bytes.NewReader(make([]byte, 5000))})
	if e := apiErr(t, resp); resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("streamed upload over the limit: %d %+v", resp.StatusCode, e)
	}
	if ok, err := a.TemplateFilesExist(ctx, hash); ok || err != nil {
		t.Errorf("a refused upload exists: %v, %v", ok, err)
	}
	if err := a.UploadTemplateFiles(ctx, hash, bytes.NewReader(make([]byte, 4096))); err != nil {
		t.Fatalf("upload at the limit: %v", err)
	}
	if ok, err := a.TemplateFilesExist(ctx, hash); !ok || err != nil {
		t.Errorf("uploaded files: exist %v, %v", ok, err)
	}
	if ok, err := b.TemplateFilesExist(ctx, hash); ok || err != nil {
		t.Errorf("another key's uploaded files: exist %v, %v", ok, err)
	}

	slow := api.TemplateSpec{From: api.TemplateBase{Template: "base"}, Steps: []api.TemplateStep{{Type: api.StepRun, Args: []string{"sleep 600"}}}}
	if _, err := a.StartTemplateBuild(ctx, api.TemplateBuildRequest{Template: "slow", Spec: slow}); err != nil {
		t.Fatal(err)
	}
	_, err := a.StartTemplateBuild(ctx, api.TemplateBuildRequest{Template: "other", Spec: envSpec("x")})
	var e *client.Error
	if !client.IsCode(err, api.CodeResourceExhausted) || !strings.Contains(err.Error(), "running for this key") {
		t.Errorf("a second build of the key: %v, want resource_exhausted", err)
	} else if errors.As(err, &e) && e.Status != http.StatusTooManyRequests {
		t.Errorf("a second build of the key: status %d, want 429", e.Status)
	}
	build(t, ctx, b, "other", envSpec("x"), api.BuildReady) // another key's limit is its own

	for _, tc := range []struct {
		name, method, path, body string
		status                   int
		msg                      string
	}{
		{"bad ref", "POST", "/v1/templates/builds", `{"template":"Bad Name","spec":{"from":{"template":"base"}}}`, 400, `template "Bad Name"`},
		{"unknown step type", "POST", "/v1/templates/builds", `{"template":"x","spec":{"from":{"template":"base"},"steps":[{"type":"HEALTHCHECK"}]}}`, 400, "step 1"},
		{"unknown base", "POST", "/v1/templates/builds", `{"template":"x","spec":{"from":{"template":"nosuch"}}}`, 404, "nosuch"},
		{"memory over the limit", "POST", "/v1/templates/builds", `{"template":"x","spec":{"from":{"template":"base"},"memory_mb":100000000}}`, 400, "memory_mb"},
		{"unknown field", "POST", "/v1/templates/builds", `{"template":"x","spec":{"from":{"template":"base"}},"cpu":1}`, 400, "cpu"},
		{"bad hash", "PUT", "/v1/templates/files/xyz", "data", 400, "64 hex"},
		{"unknown build", "GET", "/v1/templates/builds/bnosuchbuildnosuchbuildnos", "", 404, "bnosuchbuild"},
		{"malformed build id", "GET", "/v1/templates/builds/NO!", "", 400, "build id"},
		{"bad log offset", "GET", "/v1/templates/builds/bnosuchbuildnosuchbuildnos/logs?offset=-1", "", 400, "offset"},
		{"unknown template", "GET", "/v1/templates/nosuch:v9", "", 404, "nosuch:v9"},
		{"publish without a value", "PATCH", "/v1/templates/slow", `{}`, 400, "public"},
	} {
		var body *strings.Reader
		if tc.body != "" {
			body = strings.NewReader(tc.body)
		}
		var resp *http.Response
		if body != nil {
			resp = h.request(tc.method, tc.path, h.a, body)
		} else {
			resp = h.request(tc.method, tc.path, h.a, nil)
		}
		e := apiErr(t, resp)
		if resp.StatusCode != tc.status || !strings.Contains(e.Message, tc.msg) {
			t.Errorf("%s: %d %q, want %d with %q", tc.name, resp.StatusCode, e.Message, tc.status, tc.msg)
		}
	}
}
