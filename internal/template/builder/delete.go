package builder

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/template"
)

// DeleteTags removes owner's tags of template name (every tag when none
// is given) and then, if the template has no tag left, its builds and
// their files (DeleteBuilds). A tag that does not exist is ErrNotFound.
func (b *Builder) DeleteTags(ctx context.Context, owner, name string, tags ...string) error {
	if len(tags) == 0 {
		all, err := b.cfg.Records.ListTags(ctx, owner, name)
		if err != nil {
			return fmt.Errorf("listing tags of %s: %w", name, err)
		}
		for _, t := range all {
			tags = append(tags, t.Tag)
		}
	}
	for _, t := range tags {
		if err := b.cfg.Records.DeleteTag(ctx, owner, name, t); err != nil {
			return err
		}
	}
	left, err := b.cfg.Records.ListTags(ctx, owner, name)
	if err != nil {
		return fmt.Errorf("listing tags of %s: %w", name, err)
	}
	if len(left) == 0 {
		if err := b.DeleteBuilds(ctx, owner, name); err != nil {
			return fmt.Errorf("deleting the builds of %s: %w", name, err)
		}
	}
	return nil
}

// DeleteBuilds removes the records of owner's ended builds of template
// name (its tags must be gone first) and collects their files: the build
// dirs no sandbox that has not ended uses, then the layers nothing
// references. Sandboxes running from one of them keep working; their
// build dir goes at a later GC once they have ended. Builds still running
// are left alone.
func (b *Builder) DeleteBuilds(ctx context.Context, owner, name string) error {
	recs, err := b.cfg.Records.ListBuilds(ctx, owner, name, 1000)
	if err != nil {
		return fmt.Errorf("listing builds of %s: %w", name, err)
	}
	for _, r := range recs {
		if r.Status != template.BuildReady && r.Status != template.BuildError {
			continue
		}
		if err := b.cfg.Records.DeleteBuild(ctx, r.ID); err != nil {
			return fmt.Errorf("deleting build %s: %w", r.ID, err)
		}
	}
	return b.GC(ctx)
}

// orphanAge is how old a build dir without a record must be before GC
// removes it: Start makes the dir just before it records the build.
const orphanAge = 10 * time.Minute

// collectBuildDirs removes the build dirs that have no record, no running
// build and no sandbox that has not ended.
func (b *Builder) collectBuildDirs(ctx context.Context) error {
	root := filepath.Join(b.cfg.DataDir, "builds")
	ents, err := os.ReadDir(root)
	if err != nil {
		if os.IsNotExist(err) {
			return nil
		}
		return fmt.Errorf("listing build dirs: %w", err)
	}
	var used map[string]bool
	for _, e := range ents {
		id := e.Name()
		if !e.IsDir() || b.isActive(id) {
			continue
		}
		if _, err := b.cfg.Records.GetBuild(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
			if err != nil {
				return fmt.Errorf("looking up build %s: %w", id, err)
			}
			continue
		}
		fi, err := e.Info()
		if err != nil || time.Since(fi.ModTime()) < orphanAge && b.recentOrphanKept(id) {
			continue
		}
		if used == nil {
			if used, err = b.usedBuilds(ctx); err != nil {
				return err
			}
		}
		if used[id] {
			continue
		}
		if err := os.RemoveAll(filepath.Join(root, id)); err != nil {
			return fmt.Errorf("removing build dir %s: %w", id, err)
		}
	}
	return nil
}

// recentOrphanKept says a recent dir without a record is kept: it may be
// a build being started. A dir with a manifest was a finished build whose
// record was deleted: it can go at once.
func (b *Builder) recentOrphanKept(id string) bool {
	_, err := os.Stat(filepath.Join(b.buildDir(id), "template.json"))
	return err != nil
}

func (b *Builder) isActive(id string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.active[id] != nil
}

// usedBuilds are the builds sandboxes that have not ended started from.
func (b *Builder) usedBuilds(ctx context.Context) (map[string]bool, error) {
	used := map[string]bool{}
	if b.cfg.Sandboxes == nil {
		return used, nil
	}
	f := sandbox.Filter{States: []sandbox.State{sandbox.StateCreating, sandbox.StateRunning, sandbox.StatePaused, sandbox.StateStopping}, Limit: 1000}
	for {
		sbs, next, err := b.cfg.Sandboxes.List(ctx, f)
		if err != nil {
			return nil, fmt.Errorf("listing sandboxes for GC: %w", err)
		}
		for _, sb := range sbs {
			if sb.Build != "" {
				used[sb.Build] = true
			}
		}
		if next == "" {
			return used, nil
		}
		f.Token = next
	}
}
