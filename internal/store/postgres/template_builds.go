package postgres

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/store/templaterec"
	"github.com/kiln-sh/kiln/internal/template"
)

var _ template.Store = (*Store)(nil)

const buildColumns = `id, template, owner, status, spec, reason, step, layers, config, node, created_at, finished_at,
	started_at, steps_done, cached_steps, image`

// PutBuild inserts or replaces a build record.
func (s *Store) PutBuild(ctx context.Context, b template.BuildRecord) error {
	c, err := templaterec.Encode(b)
	if err != nil {
		return err
	}
	_, err = s.pool.Exec(ctx, `INSERT INTO template_builds (`+buildColumns+`)
		VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7, $8::jsonb, $9::jsonb, $10, $11, $12, $13, $14, $15, $16)
		ON CONFLICT (id) DO UPDATE SET template = excluded.template, owner = excluded.owner,
			status = excluded.status, spec = excluded.spec, reason = excluded.reason, step = excluded.step,
			layers = excluded.layers, config = excluded.config, node = excluded.node,
			created_at = excluded.created_at, finished_at = excluded.finished_at, started_at = excluded.started_at,
			steps_done = excluded.steps_done, cached_steps = excluded.cached_steps, image = excluded.image`,
		b.ID, b.Template, b.Owner, b.Status, string(c.Spec), b.Reason, b.Step, string(c.Layers), string(c.Config),
		b.Node, b.CreatedAt, nullTime(b.FinishedAt), nullTime(b.StartedAt), b.StepsDone, b.CachedSteps, b.Image)
	if err != nil {
		return fmt.Errorf("writing template build %s: %w", b.ID, err)
	}
	return nil
}

// GetBuild returns a build record.
func (s *Store) GetBuild(ctx context.Context, id string) (template.BuildRecord, error) {
	b, err := scanBuild(s.pool.QueryRow(ctx, `SELECT `+buildColumns+` FROM template_builds WHERE id = $1`, id))
	if notFound(err) {
		return template.BuildRecord{}, fmt.Errorf("template build %q: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return template.BuildRecord{}, fmt.Errorf("reading template build %q: %w", id, err)
	}
	return b, nil
}

// ListBuilds returns owner's builds of the named template ("" owner: any
// owner's; "" name: every template's), newest first, at most limit.
func (s *Store) ListBuilds(ctx context.Context, owner, name string, limit int) ([]template.BuildRecord, error) {
	n, err := templaterec.Limit(limit)
	if err != nil {
		return nil, err
	}
	w, args := where(eq{"owner", owner}, eq{"template", name})
	args = append(args, n)
	return queryAll(ctx, s.pool, "template builds", scanBuild, `SELECT `+buildColumns+` FROM template_builds`+w+`
		ORDER BY created_at DESC, id DESC LIMIT $`+strconv.Itoa(len(args)), args...)
}

// BuildsIn returns every build in one of the given states, oldest first.
func (s *Store) BuildsIn(ctx context.Context, states ...string) ([]template.BuildRecord, error) {
	if len(states) == 0 {
		return nil, nil
	}
	return queryAll(ctx, s.pool, "template builds", scanBuild, `SELECT `+buildColumns+` FROM template_builds
		WHERE status = ANY($1) ORDER BY created_at, id`, states)
}

// DeleteBuild removes a build record; deleting a missing one succeeds.
func (s *Store) DeleteBuild(ctx context.Context, id string) error {
	if _, err := s.pool.Exec(ctx, `DELETE FROM template_builds WHERE id = $1`, id); err != nil {
		return fmt.Errorf("deleting template build %s: %w", id, err)
	}
	return nil
}

func scanBuild(row scanner) (template.BuildRecord, error) {
	var (
		b        template.BuildRecord
		c        templaterec.Columns
		finished *time.Time
		started  *time.Time
	)
	if err := row.Scan(&b.ID, &b.Template, &b.Owner, &b.Status, &c.Spec, &b.Reason, &b.Step, &c.Layers, &c.Config,
		&b.Node, &b.CreatedAt, &finished, &started, &b.StepsDone, &b.CachedSteps, &b.Image); err != nil {
		return b, err
	}
	b.CreatedAt = b.CreatedAt.UTC()
	if finished != nil {
		b.FinishedAt = finished.UTC()
	}
	if started != nil {
		b.StartedAt = started.UTC()
	}
	return b, templaterec.Decode(&b, c)
}
