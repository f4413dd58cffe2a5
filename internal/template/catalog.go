package template

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// Catalog finds the template a name means to a caller: the caller's own
// custom template of that name and tag, else a public one, else a
// built-in. Custom templates' builds live in BuildDir, one directory per
// build (template.json, warm/); their layers in the layer store.
type Catalog struct {
	DataDir string
	Store   Store // nil: built-ins only
	fetch   atomic.Pointer[Fetcher]
}

// Fetcher makes a build whose files this node does not hold usable here,
// from its image in the cluster registry (builder.Builder.Fetch).
type Fetcher func(ctx context.Context, rec BuildRecord) (*Template, error)

// SetFetch makes Load (and Resolve) fetch the ready builds with an image
// that this node does not hold with f.
func (c *Catalog) SetFetch(f Fetcher) { c.fetch.Store(&f) }

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
		return c.Load(ctx, id)
	case tag != DefaultTag:
		return nil, fmt.Errorf("template %s:%s: %w", name, tag, errdefs.ErrNotFound)
	}
	return Lookup(c.DataDir, name)
}

// Where says where the files of a custom template build are.
type Where struct {
	Build string // "" for a built-in, which every node has
	Node  string // the node that built it
	// Image is the build in the cluster registry: any node can pull it
	// ("": the build is on Node only).
	Image string
}

// Where is where the custom template ref means to owner is (zero for a
// built-in, or a ref that names nothing: the node that gets the create
// says so). It reads records only, so a cluster front, which has no
// templates, can place by it.
func (c *Catalog) Where(ctx context.Context, owner, ref string) (Where, error) {
	_, _, id, err := c.buildOf(ctx, owner, ref)
	if err != nil || id == "" {
		return Where{}, err
	}
	b, err := c.Store.GetBuild(ctx, id)
	if err != nil {
		return Where{}, fmt.Errorf("looking up template build %s: %w", id, err)
	}
	return Where{Build: id, Node: b.Node, Image: b.Image}, nil
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

// Load is Build, fetching a ready build that this node does not hold
// from the cluster registry when it can (SetFetch).
func (c *Catalog) Load(ctx context.Context, id string) (*Template, error) {
	t, err := c.Build(id)
	f := c.fetch.Load()
	if !errors.Is(err, errdefs.ErrNotFound) || f == nil || c.Store == nil {
		return t, err
	}
	rec, rerr := c.Store.GetBuild(ctx, id)
	if rerr != nil || rec.Image == "" || rec.Status != BuildReady {
		return t, err
	}
	return (*f)(ctx, rec)
}

// Builds returns the ids of the custom template builds whose files are
// under dataDir (their manifest is written), in no particular order.
func Builds(dataDir string) []string {
	ents, err := os.ReadDir(filepath.Join(dataDir, "builds"))
	if err != nil {
		return nil
	}
	var ids []string
	for _, e := range ents {
		if !e.IsDir() || !buildIDRE.MatchString(e.Name()) {
			continue
		}
		if _, err := os.Stat(filepath.Join(dataDir, "builds", e.Name(), manifestName)); err == nil {
			ids = append(ids, e.Name())
		}
	}
	return ids
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
