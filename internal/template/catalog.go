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
	name, tag, id, err := c.buildOf(ctx, owner, ref)
	switch {
	case err != nil:
		return nil, err
	case id != "":
		return c.Build(id)
	case tag != DefaultTag:
		return nil, fmt.Errorf("template %s:%s: %w", name, tag, errdefs.ErrNotFound)
	}
	return Lookup(c.DataDir, name)
}

// Node is the node that holds the files of the custom template ref means
// to owner ("" for a built-in, which every node has, or a ref that names
// nothing: the node that gets the create says so). It reads records
// only, so a cluster front, which has no templates, can place by it.
func (c *Catalog) Node(ctx context.Context, owner, ref string) (string, error) {
	_, _, id, err := c.buildOf(ctx, owner, ref)
	if err != nil || id == "" {
		return "", err
	}
	b, err := c.Store.GetBuild(ctx, id)
	if err != nil {
		return "", fmt.Errorf("looking up template build %s: %w", id, err)
	}
	return b.Node, nil
}

// buildOf parses ref and finds the custom build it means to owner: its
// own tag, else a public one; id is "" when neither exists (a built-in,
// or nothing).
func (c *Catalog) buildOf(ctx context.Context, owner, ref string) (name, tag, id string, err error) {
	if name, tag, err = ParseRef(ref); err != nil || c.Store == nil {
		return name, tag, "", err
	}
	t, err := c.Store.GetTag(ctx, owner, name, tag)
	if err == nil {
		return name, tag, t.BuildID, nil
	}
	if !errors.Is(err, errdefs.ErrNotFound) {
		return name, tag, "", fmt.Errorf("looking up template %s:%s: %w", name, tag, err)
	}
	pub, err := c.Store.PublicTags(ctx, name)
	if err != nil {
		return name, tag, "", fmt.Errorf("looking up template %s:%s: %w", name, tag, err)
	}
	for _, p := range pub {
		if p.Tag == tag {
			return name, tag, p.BuildID, nil
		}
	}
	return name, tag, "", nil
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
