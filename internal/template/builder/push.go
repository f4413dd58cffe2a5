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
	c := image.Config{User: t.Defaults.User, Workdir: t.Defaults.Workdir}
	for k, v := range t.Defaults.Env {
		c.Env = append(c.Env, k+"="+v)
	}
	slices.Sort(c.Env)
	if t.Warm != nil {
		c.Cmd = t.Warm.Start
	}
	return image.Push(ctx, ref, layers, c, auth, b.cfg.Registries)
}
