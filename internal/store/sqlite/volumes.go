package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/volume"
)

var _ volume.Store = (*Store)(nil)

const volumeColumns = `id, name, owner, size_bytes, node, created_at`

// PutVolume inserts a volume record; errdefs.ErrAlreadyExists if its id,
// or its name for its owner, is taken.
func (s *Store) PutVolume(ctx context.Context, v volume.Volume) error {
	_, err := s.w.ExecContext(ctx, `INSERT INTO volumes (`+volumeColumns+`) VALUES (?, ?, ?, ?, ?, ?)`,
		v.ID, v.Name, v.Owner, v.SizeBytes, v.Node, micros(v.CreatedAt))
	if isConstraint(err) {
		return fmt.Errorf("volume %q: %w", v.Name, errdefs.ErrAlreadyExists)
	}
	if err != nil {
		return fmt.Errorf("writing volume %s: %w", v.ID, err)
	}
	return nil
}

// GetVolume returns the volume id.
func (s *Store) GetVolume(ctx context.Context, id string) (volume.Volume, error) {
	return s.getVolume(ctx, id, `id = ?`, id)
}

// GetVolumeByName returns owner's volume called name.
func (s *Store) GetVolumeByName(ctx context.Context, owner, name string) (volume.Volume, error) {
	return s.getVolume(ctx, name, `owner = ? AND name = ?`, owner, name)
}

func (s *Store) getVolume(ctx context.Context, what, cond string, args ...any) (volume.Volume, error) {
	v, err := scanVolume(s.r.QueryRowContext(ctx, `SELECT `+volumeColumns+` FROM volumes WHERE `+cond, args...))
	if errors.Is(err, sql.ErrNoRows) {
		return volume.Volume{}, fmt.Errorf("volume %q: %w", what, errdefs.ErrNotFound)
	}
	if err != nil {
		return volume.Volume{}, fmt.Errorf("reading volume %q: %w", what, err)
	}
	return v, nil
}

// ListVolumes returns owner's volumes, oldest first.
func (s *Store) ListVolumes(ctx context.Context, owner string) ([]volume.Volume, error) {
	return queryAll(ctx, s.r, "volumes", scanVolume, `SELECT `+volumeColumns+` FROM volumes WHERE owner = ?
		ORDER BY created_at, id`, owner)
}

// DeleteVolume removes a volume record and its mount rows.
func (s *Store) DeleteVolume(ctx context.Context, id string) error {
	if _, err := s.w.ExecContext(ctx, `DELETE FROM volumes WHERE id = ?`, id); err != nil {
		return fmt.Errorf("deleting volume %s: %w", id, err)
	}
	return nil
}

// PutVolumeMounts records that sandbox mounts the volumes ids.
func (s *Store) PutVolumeMounts(ctx context.Context, sandbox string, ids []string) error {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("recording volume mounts: %w", err)
	}
	defer tx.Rollback()
	for _, id := range ids {
		if _, err := tx.ExecContext(ctx, `INSERT INTO volume_mounts (sandbox_id, volume_id) VALUES (?, ?)
			ON CONFLICT DO NOTHING`, sandbox, id); err != nil {
			return fmt.Errorf("recording volume mounts of %s: %w", sandbox, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("recording volume mounts of %s: %w", sandbox, err)
	}
	return nil
}

// VolumeInUse reports whether a sandbox that has not ended mounts id.
func (s *Store) VolumeInUse(ctx context.Context, id string) (bool, error) {
	var n int
	err := s.r.QueryRowContext(ctx, `SELECT COUNT(*) FROM volume_mounts m JOIN sandboxes s ON s.id = m.sandbox_id
		WHERE m.volume_id = ? AND s.state NOT IN ('stopped', 'failed')`, id).Scan(&n)
	if err != nil {
		return false, fmt.Errorf("checking volume %s: %w", id, err)
	}
	return n > 0, nil
}

func scanVolume(row scanner) (volume.Volume, error) {
	var (
		v       volume.Volume
		created int64
	)
	if err := row.Scan(&v.ID, &v.Name, &v.Owner, &v.SizeBytes, &v.Node, &created); err != nil {
		return v, err
	}
	v.CreatedAt = fromMicros(created)
	return v, nil
}

// encodeVolumes is the volumes column of sb's record: its mounts, as
// JSON ("[]" for none).
func encodeVolumes(sb sandbox.Sandbox) (string, error) {
	vs := sb.Volumes
	if vs == nil {
		vs = []sandbox.VolumeMount{}
	}
	b, err := json.Marshal(vs)
	if err != nil {
		return "", fmt.Errorf("encoding sandbox %s volumes: %w", sb.ID, err)
	}
	return string(b), nil
}

// decodeVolumes reads the volumes column into sb (nil for none).
func decodeVolumes(b []byte, sb *sandbox.Sandbox) error {
	var vs []sandbox.VolumeMount
	if err := json.Unmarshal(b, &vs); err != nil {
		return fmt.Errorf("decoding sandbox %s volumes: %w", sb.ID, err)
	}
	if len(vs) > 0 {
		sb.Volumes = vs
	}
	return nil
}
