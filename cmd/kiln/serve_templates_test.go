package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/client"
	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/oci/ocitest"
	"github.com/kiln-sh/kiln/internal/servetest"
	"github.com/kiln-sh/kiln/internal/template"
)

// TestServeTemplates: a real kiln serve builds a template (its limits
// from the environment), a sandbox of it sees the RUN step's file, and
// /metrics counts the build.
func TestServeTemplates(t *testing.T) {
	ocitest.RequireRoot(t)
	_, err := template.Lookup(config.FromEnv().DataDir, "base")
	ocitest.Require(t, err == nil, fmt.Sprintf("base template not built (make setup): %v", err))
	t.Setenv("KILN_MAX_BUILDS_PER_KEY", "1")
	s := servetest.Start(t, servetest.Build(t))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := s.Client
	spec := api.TemplateSpec{From: api.TemplateBase{Template: "base"},
		Steps: []api.TemplateStep{{Type: api.StepRun, Args: []string{"echo from-serve > /opt/x.txt"}}}}
	b, err := c.StartTemplateBuild(ctx, api.TemplateBuildRequest{Template: "served", Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	// One build at a time for this key (KILN_MAX_BUILDS_PER_KEY=1).
	if _, err := c.StartTemplateBuild(ctx, api.TemplateBuildRequest{Template: "second", Spec: spec}); !client.IsCode(err, api.CodeResourceExhausted) {
		t.Errorf("a second build while one runs: %v, want resource_exhausted", err)
	}
	if b, err = c.WaitTemplateBuild(ctx, b.ID); err != nil || b.Status != api.BuildReady {
		t.Fatalf("build: %+v, %v", b, err)
	}
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "served"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Output(ctx, sb.ID, api.CommandRequest{Cmd: "cat /opt/x.txt"})
	if err != nil || res.Stdout != "from-serve\n" {
		t.Errorf("sandbox of the template: %+v, %v", res, err)
	}
	req, _ := http.NewRequestWithContext(ctx, "GET", s.URL+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+s.Key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	m, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(m), `kiln_template_builds_total{status="ready"} 1`) {
		t.Errorf("/metrics does not count the build")
	}
}
