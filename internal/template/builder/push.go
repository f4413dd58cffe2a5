package builder

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/template"
	"github.com/kiln-sh/kiln/internal/template/image"
)

// Push pushes the build t to ref as an OCI image (image.Push): its layers,
// bottom first, and as its config the template's env, user, working
// directory and start command, so the image is a base that builds and
// other tools take as this template. It connects only where the
// builder's registry guard lets pulls connect.
func (b *Builder) Push(ctx context.Context, t *template.Template, ref string, auth *api.RegistryAuth) (string, error) {
	if ref == "" || len(ref) > 512 {
		return "", fmt.Errorf("image: want [registry/]repository[:tag] of at most 512 bytes: %w", errdefs.ErrInvalidArgument)
	}
	layers := t.Layers
	if len(layers) == 0 { // a built-in: its lower dirs, top first
		layers = strings.Split(t.Rootfs, ":")
		slices.Reverse(layers)
	}
	start := ""
	if t.Warm != nil {
		start = t.Warm.Start
	}
	return image.Push(ctx, ref, layers, imageConfig(t.Defaults, start), auth, b.cfg.Registries)
}

// imageConfig is the image config of a template with defaults d and
// start command start: its env (sorted, so the same template is the same
// image), user, working directory and command.
func imageConfig(d template.Defaults, start string) image.Config {
	c := image.Config{User: d.User, Workdir: d.Workdir, Cmd: start}
	for k, v := range d.Env {
		c.Env = append(c.Env, k+"="+v)
	}
	slices.Sort(c.Env)
	return c
}
