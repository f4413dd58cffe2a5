package client

import (
	"context"
	"fmt"
	"io"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/template/dockerfile"
)

// DockerfileBuild is a build of a template from a Dockerfile and its
// context directory, as `kiln template build -f Dockerfile CONTEXT_DIR`.
type DockerfileBuild struct {
	// Template is "name" or "name:tag".
	Template string
	// Dockerfile is the Dockerfile's text; ContextDir the directory its
	// COPY/ADD sources are relative to (its .dockerignore is honoured).
	Dockerfile string
	ContextDir string
	// BuildArgs override ARG defaults (docker build --build-arg).
	BuildArgs map[string]string
	// StartCmd and ReadyCmd, when set, replace the Dockerfile's CMD /
	// ENTRYPOINT and the ready check.
	StartCmd, ReadyCmd string
	NoCache, Public    bool
	// CPUs, MemoryMB and DiskMB are the template's default resources (0:
	// the server's defaults).
	CPUs             int
	MemoryMB, DiskMB int
	// OnWarning, if set, receives each warning of the compile
	// ("Dockerfile:3: EXPOSE is ignored ...").
	OnWarning func(string)
}

// BuildDockerfile compiles a Dockerfile on the client (the server never
// sees it), uploads the context files each COPY/ADD step needs (skipping
// those the key uploaded before), and starts the build. Errors of the
// Dockerfile name its line.
func (c *Client) BuildDockerfile(ctx context.Context, b DockerfileBuild) (*api.TemplateBuild, error) {
	spec, err := c.compileDockerfile(ctx, b)
	if err != nil {
		return nil, err
	}
	return c.StartTemplateBuild(ctx, api.TemplateBuildRequest{Template: b.Template, Spec: *spec, Public: b.Public})
}

// compileDockerfile turns b into a recipe and uploads its files.
func (c *Client) compileDockerfile(ctx context.Context, b DockerfileBuild) (*api.TemplateSpec, error) {
	isTemplate := func(name string) bool {
		_, err := c.GetTemplate(ctx, name)
		return err == nil
	}
	spec, warnings, err := dockerfile.Compile([]byte(b.Dockerfile), dockerfile.Options{BuildArgs: b.BuildArgs, IsTemplate: isTemplate})
	if err != nil {
		return nil, err
	}
	if b.OnWarning != nil {
		for _, w := range warnings {
			b.OnWarning(w)
		}
	}
	if b.StartCmd != "" {
		spec.StartCmd = b.StartCmd
	}
	if b.ReadyCmd != "" {
		spec.ReadyCmd = b.ReadyCmd
	}
	spec.NoCache = b.NoCache
	spec.CPUs, spec.MemoryMB, spec.DiskMB = b.CPUs, b.MemoryMB, b.DiskMB
	if err := c.uploadContext(ctx, b.ContextDir, spec.Steps); err != nil {
		return nil, err
	}
	return spec, nil
}

// uploadContext hashes the COPY/ADD steps' sources in dir and uploads
// those the server does not have yet.
func (c *Client) uploadContext(ctx context.Context, dir string, steps []api.TemplateStep) error {
	need := false
	for _, s := range steps {
		need = need || s.Type == api.StepCopy || s.Type == api.StepAdd
	}
	if !need {
		return nil
	}
	if dir == "" {
		dir = "."
	}
	bc, err := dockerfile.OpenContext(dir)
	if err != nil {
		return err
	}
	defer bc.Close()
	if err := bc.HashSteps(steps); err != nil {
		return err
	}
	done := map[string]bool{}
	for _, s := range steps {
		if s.FilesHash == "" || done[s.FilesHash] {
			continue
		}
		done[s.FilesHash] = true
		ok, err := c.TemplateFilesExist(ctx, s.FilesHash)
		if err != nil {
			return fmt.Errorf("checking the files of %s %s: %w", s.Type, s.Args[0], err)
		}
		if ok {
			continue
		}
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(bc.WriteTar(pw, s.Args[0])) }()
		err = c.UploadTemplateFiles(ctx, s.FilesHash, pr)
		pr.CloseWithError(io.ErrClosedPipe) // stops the writer if the upload ended early
		if err != nil {
			return fmt.Errorf("uploading the files of %s %s: %w", s.Type, s.Args[0], err)
		}
	}
	return nil
}
