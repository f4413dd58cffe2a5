package builder

import (
	"context"
	"fmt"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/template"
)

// E2B's template API names a build before it has a recipe: POST
// /v3/templates answers the build's id, the client then uploads the
// files of its COPY steps and posts the steps for that id. Reserve
// records such a build, waiting; StartReserved starts it. A restart of
// kiln serve fails the builds still waiting (New).

// MaxWaiting bounds the builds one owner may have reserved and not
// started.
const MaxWaiting = 16

// superseded is the reason of a waiting build a newer reservation of the
// same template replaced.
const superseded = "superseded by a newer build of the template before it started"

// Reserve records a waiting build of owner's template name. An earlier
// waiting build of the same template fails (superseded), as E2B cancels
// concurrent builds of a template; more than MaxWaiting waiting builds of
// the owner are ErrResourceExhausted.
func (b *Builder) Reserve(ctx context.Context, owner, name string) (template.BuildRecord, error) {
	if !template.ValidName(name) {
		return template.BuildRecord{}, fmt.Errorf("template %q: want 1-63 lowercase letters, digits, '.', '_' or '-': %w",
			errdefs.ClipN(name, 80), errdefs.ErrInvalidArgument)
	}
	b.reserveMu.Lock()
	defer b.reserveMu.Unlock()
	recs, err := b.cfg.Records.ListBuilds(ctx, owner, "", 1000)
	if err != nil {
		return template.BuildRecord{}, fmt.Errorf("listing builds: %w", err)
	}
	waiting := 0
	for _, r := range recs {
		if r.Status != template.BuildWaiting {
			continue
		}
		if r.Template != name {
			waiting++
			continue
		}
		r.Status, r.Reason, r.FinishedAt = template.BuildError, superseded, time.Now().UTC()
		if err := b.cfg.Records.PutBuild(ctx, r); err != nil {
			return template.BuildRecord{}, fmt.Errorf("failing build %s: %w", r.ID, err)
		}
	}
	if waiting >= MaxWaiting {
		return template.BuildRecord{}, fmt.Errorf("%d template builds of this key are waiting for their steps, the most allowed: %w", waiting, errdefs.ErrResourceExhausted)
	}
	rec := template.BuildRecord{ID: newBuildID(), Template: name, Owner: owner, Status: template.BuildWaiting,
		Step: -1, Node: b.cfg.Node, CreatedAt: time.Now().UTC()}
	if err := b.cfg.Records.PutBuild(ctx, rec); err != nil {
		return template.BuildRecord{}, fmt.Errorf("recording build: %w", err)
	}
	return rec, nil
}

// StartReserved validates spec and starts build id, which Reserve
// recorded for owner and is still waiting (ErrNotFound for another
// owner's, ErrFailedPrecondition for one not waiting), as Start does;
// once ready, each of tags points at it.
func (b *Builder) StartReserved(ctx context.Context, owner, id string, tags []string, spec api.TemplateSpec, public bool) (template.BuildRecord, error) {
	b.reserveMu.Lock()
	defer b.reserveMu.Unlock()
	rec, err := b.cfg.Records.GetBuild(ctx, id)
	if err == nil && rec.Owner != owner {
		err = fmt.Errorf("template build %s: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return template.BuildRecord{}, err
	}
	if rec.Status != template.BuildWaiting {
		return template.BuildRecord{}, fmt.Errorf("build %s is %s: only a waiting build can be started: %w", rec.ID, rec.Status, errdefs.ErrFailedPrecondition)
	}
	if len(tags) == 0 {
		tags = []string{template.DefaultTag}
	}
	for _, t := range tags {
		if !template.ValidName(t) {
			return template.BuildRecord{}, fmt.Errorf("tag %q: want 1-63 lowercase letters, digits, '.', '_' or '-': %w", errdefs.ClipN(t, 80), errdefs.ErrInvalidArgument)
		}
	}
	if err := validate(&spec); err != nil {
		return template.BuildRecord{}, err
	}
	return b.launch(ctx, rec, tags, spec, public)
}
