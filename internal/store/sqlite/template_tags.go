package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/template"
)

const tagColumns = `owner, name, tag, build_id, public, updated_at`

// PutTag points a tag at a build, replacing what it pointed at.
func (s *Store) PutTag(ctx context.Context, t template.TagRecord) error {
	_, err := s.w.ExecContext(ctx, `INSERT INTO template_tags (`+tagColumns+`) VALUES (?, ?, ?, ?, ?, ?)
		ON CONFLICT (owner, name, tag) DO UPDATE SET build_id = excluded.build_id, public = excluded.public,
			updated_at = excluded.updated_at`,
		t.Owner, t.Name, t.Tag, t.BuildID, t.Public, micros(t.UpdatedAt))
	if err != nil {
		return fmt.Errorf("writing template tag %s:%s: %w", t.Name, t.Tag, err)
	}
	return nil
}

// GetTag returns owner's tag.
func (s *Store) GetTag(ctx context.Context, owner, name, tag string) (template.TagRecord, error) {
	t, err := scanTag(s.r.QueryRowContext(ctx, `SELECT `+tagColumns+` FROM template_tags
		WHERE owner = ? AND name = ? AND tag = ?`, owner, name, tag))
	if errors.Is(err, sql.ErrNoRows) {
		return template.TagRecord{}, fmt.Errorf("template %s:%s: %w", name, tag, errdefs.ErrNotFound)
	}
	if err != nil {
		return template.TagRecord{}, fmt.Errorf("reading template tag %s:%s: %w", name, tag, err)
	}
	return t, nil
}

// ListTags returns the tags of owner's templates ("" owner: every
// owner's; "" name: every template's), by name then tag (then owner).
func (s *Store) ListTags(ctx context.Context, owner, name string) ([]template.TagRecord, error) {
	w, args := where(eq{"owner", owner}, eq{"name", name})
	return queryAll(ctx, s.r, "template tags", scanTag, `SELECT `+tagColumns+` FROM template_tags`+w+`
		ORDER BY name, tag, owner`, args...)
}

// PublicTags returns the tags of public templates named name ("": all),
// by owner then tag (then name).
func (s *Store) PublicTags(ctx context.Context, name string) ([]template.TagRecord, error) {
	q, args := `SELECT `+tagColumns+` FROM template_tags WHERE public`, []any{}
	if name != "" {
		q, args = q+` AND name = ?`, append(args, name)
	}
	return queryAll(ctx, s.r, "template tags", scanTag, q+`
		ORDER BY owner, tag, name`, args...)
}

// DeleteTag removes a tag; errdefs.ErrNotFound if it did not exist.
func (s *Store) DeleteTag(ctx context.Context, owner, name, tag string) error {
	res, err := s.w.ExecContext(ctx, `DELETE FROM template_tags WHERE owner = ? AND name = ? AND tag = ?`, owner, name, tag)
	return affected(res, err, fmt.Sprintf("deleting template tag %s:%s", name, tag), fmt.Sprintf("template %s:%s", name, tag))
}

// SetPublic marks every tag of owner's template public or private;
// errdefs.ErrNotFound if it has none.
func (s *Store) SetPublic(ctx context.Context, owner, name string, public bool) error {
	res, err := s.w.ExecContext(ctx, `UPDATE template_tags SET public = ? WHERE owner = ? AND name = ?`, public, owner, name)
	return affected(res, err, "setting template "+name+" public", "template "+name)
}

func scanTag(row scanner) (template.TagRecord, error) {
	var (
		t       template.TagRecord
		updated int64
	)
	if err := row.Scan(&t.Owner, &t.Name, &t.Tag, &t.BuildID, &t.Public, &updated); err != nil {
		return t, err
	}
	t.UpdatedAt = fromMicros(updated)
	return t, nil
}
