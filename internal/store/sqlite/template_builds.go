package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

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
	_, err = s.w.ExecContext(ctx, `INSERT INTO template_builds (`+buildColumns+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET template = excluded.template, owner = excluded.owner,
			status = excluded.status, spec = excluded.spec, reason = excluded.reason, step = excluded.step,
			layers = excluded.layers, config = excluded.config, node = excluded.node,
			created_at = excluded.created_at, finished_at = excluded.finished_at, started_at = excluded.started_at,
			steps_done = excluded.steps_done, cached_steps = excluded.cached_steps, image = excluded.image`,
		b.ID, b.Template, b.Owner, b.Status, string(c.Spec), b.Reason, b.Step, string(c.Layers), string(c.Config),
		b.Node, micros(b.CreatedAt), nullMicros(b.FinishedAt), nullMicros(b.StartedAt), b.StepsDone, b.CachedSteps, b.Image)
	if err != nil {
		return fmt.Errorf("writing template build %s: %w", b.ID, err)
	}
	return nil
}

// GetBuild returns a build record.
func (s *Store) GetBuild(ctx context.Context, id string) (template.BuildRecord, error) {
	b, err := scanBuild(s.r.QueryRowContext(ctx, `SELECT `+buildColumns+` FROM template_builds WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
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
	return queryAll(ctx, s.r, "template builds", scanBuild, `SELECT `+buildColumns+` FROM template_builds`+w+`
		ORDER BY created_at DESC, id DESC LIMIT ?`, append(args, n)...)
}

// BuildsIn returns every build in one of the given states, oldest first.
func (s *Store) BuildsIn(ctx context.Context, states ...string) ([]template.BuildRecord, error) {
	if len(states) == 0 {
		return nil, nil
	}
	args := make([]any, len(states))
	for i, st := range states {
		args[i] = st
	}
	marks := strings.Repeat(", ?", len(states))[2:]
	return queryAll(ctx, s.r, "template builds", scanBuild, `SELECT `+buildColumns+` FROM template_builds
		WHERE status IN (`+marks+`) ORDER BY created_at, id`, args...)
}

// DeleteBuild removes a build record; deleting a missing one succeeds.
func (s *Store) DeleteBuild(ctx context.Context, id string) error {
	if _, err := s.w.ExecContext(ctx, `DELETE FROM template_builds WHERE id = ?`, id); err != nil {
		return fmt.Errorf("deleting template build %s: %w", id, err)
	}
	return nil
}

func scanBuild(row scanner) (template.BuildRecord, error) {
	var (
		b                    template.BuildRecord
		spec, layers, config string
		created              int64
		finished, started    sql.NullInt64
	)
	if err := row.Scan(&b.ID, &b.Template, &b.Owner, &b.Status, &spec, &b.Reason, &b.Step, &layers, &config,
		&b.Node, &created, &finished, &started, &b.StepsDone, &b.CachedSteps, &b.Image); err != nil {
		return b, err
	}
	b.CreatedAt = fromMicros(created)
	if finished.Valid {
		b.FinishedAt = fromMicros(finished.Int64)
	}
	if started.Valid {
		b.StartedAt = fromMicros(started.Int64)
	}
	return b, templaterec.Decode(&b, templaterec.Columns{Spec: []byte(spec), Config: []byte(config), Layers: []byte(layers)})
}
