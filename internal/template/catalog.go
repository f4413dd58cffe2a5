package template

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// Catalog finds the template a name means to a caller: the caller's own
// custom template of that name and tag, else a public one, else a
// built-in. Custom templates' builds live in BuildDir, one directory per
// build (template.json, warm/); their layers in the layer store.
type Catalog struct {
	DataDir string
	Store   Store // nil: built-ins only
}

// ParseRef splits "name" or "name:tag" (tag defaults to DefaultTag).
func ParseRef(ref string) (name, tag string, err error) {
	name, tag, _ = strings.Cut(ref, ":")
	if tag == "" {
		tag = DefaultTag
	}
	if !ValidName(name) || !ValidName(tag) {
		return "", "", fmt.Errorf("template %q: want name or name:tag, each 1-63 lowercase letters, digits, '.', '_' or '-': %w",
			errdefs.ClipN(ref, 80), errdefs.ErrInvalidArgument)
	}
	return name, tag, nil
}

var buildIDRE = regexp.MustCompile(`^[a-z0-9]{8,40}$`)

// BuildDir is where the files of build id live under a data dir.
func BuildDir(dataDir, id string) string { return filepath.Join(dataDir, "builds", id) }

// Resolve returns the build that ref ("name[:tag]") means to owner.
func (c *Catalog) Resolve(ctx context.Context, owner, ref string) (*Template, error) {
	name, tag, err := ParseRef(ref)
	if err != nil {
		return nil, err
	}
	if c.Store != nil {
		t, err := c.Store.GetTag(ctx, owner, name, tag)
		if err == nil {
			return c.Build(t.BuildID)
		}
		if !errors.Is(err, errdefs.ErrNotFound) {
			return nil, fmt.Errorf("looking up template %s:%s: %w", name, tag, err)
		}
		pub, err := c.Store.PublicTags(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("looking up template %s:%s: %w", name, tag, err)
		}
		for _, p := range pub {
			if p.Tag == tag {
				return c.Build(p.BuildID)
			}
		}
	}
	if tag != DefaultTag {
		return nil, fmt.Errorf("template %s:%s: %w", name, tag, errdefs.ErrNotFound)
	}
	return Lookup(c.DataDir, name)
}

// Build returns a custom template's build by id, whatever its name now
// points at: a sandbox keeps the build it started from.
func (c *Catalog) Build(id string) (*Template, error) {
	if !buildIDRE.MatchString(id) {
		return nil, fmt.Errorf("template build %q: %w", errdefs.ClipN(id, 80), errdefs.ErrInvalidArgument)
	}
	t, err := ReadBuild(BuildDir(c.DataDir, id))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("template build %s: %w", id, errdefs.ErrNotFound)
	}
	return t, err
}
