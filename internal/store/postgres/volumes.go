package postgres

import (
	"context"
	"encoding/json"
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
	_, err := s.pool.Exec(ctx, `INSERT INTO volumes (`+volumeColumns+`) VALUES ($1, $2, $3, $4, $5, $6)`,
		v.ID, v.Name, v.Owner, v.SizeBytes, v.Node, v.CreatedAt)
	if isUniqueViolation(err) {
		return fmt.Errorf("volume %q: %w", v.Name, errdefs.ErrAlreadyExists)
	}
	if err != nil {
		return fmt.Errorf("writing volume %s: %w", v.ID, err)
	}
	return nil
}

// GetVolume returns the volume id.
func (s *Store) GetVolume(ctx context.Context, id string) (volume.Volume, error) {
	return s.getVolume(ctx, id, `id = $1`, id)
}

// GetVolumeByName returns owner's volume called name.
func (s *Store) GetVolumeByName(ctx context.Context, owner, name string) (volume.Volume, error) {
	return s.getVolume(ctx, name, `owner = $1 AND name = $2`, owner, name)
}

func (s *Store) getVolume(ctx context.Context, what, cond string, args ...any) (volume.Volume, error) {
	v, err := scanVolume(s.pool.QueryRow(ctx, `SELECT `+volumeColumns+` FROM volumes WHERE `+cond, args...))
	if notFound(err) {
		return volume.Volume{}, fmt.Errorf("volume %q: %w", what, errdefs.ErrNotFound)
	}
	if err != nil {
		return volume.Volume{}, fmt.Errorf("reading volume %q: %w", what, err)
	}
	return v, nil
}

// ListVolumes returns owner's volumes, oldest first.
func (s *Store) ListVolumes(ctx context.Context, owner string) ([]volume.Volume, error) {
	return queryAll(ctx, s.pool, "volumes", scanVolume, `SELECT `+volumeColumns+` FROM volumes WHERE owner = $1
		ORDER BY created_at, id`, owner)
}

// DeleteVolume removes a volume record and its mount rows.
func (s *Store) DeleteVolume(ctx context.Context, id string) error {
	if _, err := s.pool.Exec(ctx, `DELETE FROM volumes WHERE id = $1`, id); err != nil {
		return fmt.Errorf("deleting volume %s: %w", id, err)
	}
	return nil
}

// PutVolumeMounts records that sandbox mounts the volumes ids.
func (s *Store) PutVolumeMounts(ctx context.Context, sandbox string, ids []string) error {
	if _, err := s.pool.Exec(ctx, `INSERT INTO volume_mounts (sandbox_id, volume_id)
		SELECT $1, unnest($2::text[]) ON CONFLICT DO NOTHING`, sandbox, ids); err != nil {
		return fmt.Errorf("recording volume mounts of %s: %w", sandbox, err)
	}
	return nil
}

// VolumeInUse reports whether a sandbox that has not ended mounts id.
func (s *Store) VolumeInUse(ctx context.Context, id string) (bool, error) {
	var inUse bool
	err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM volume_mounts m JOIN sandboxes s ON s.id = m.sandbox_id
		WHERE m.volume_id = $1 AND s.state NOT IN ('stopped', 'failed'))`, id).Scan(&inUse)
	if err != nil {
		return false, fmt.Errorf("checking volume %s: %w", id, err)
	}
	return inUse, nil
}

func scanVolume(row scanner) (volume.Volume, error) {
	var v volume.Volume
	if err := row.Scan(&v.ID, &v.Name, &v.Owner, &v.SizeBytes, &v.Node, &v.CreatedAt); err != nil {
		return v, err
	}
	v.CreatedAt = v.CreatedAt.UTC()
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
