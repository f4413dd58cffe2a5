package postgres

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

const snapshotColumns = `id, name, owner, source, template, runtime, limits, user_name, workdir,
	env, metadata, size_bytes, node, created_at, build, image`

// PutSnapshot inserts a snapshot record; errdefs.ErrAlreadyExists if its
// id, or its name for its owner, is taken.
func (s *Store) PutSnapshot(ctx context.Context, sn sandbox.Snapshot) error {
	limits, err := json.Marshal(sn.Limits)
	if err != nil {
		return fmt.Errorf("encoding snapshot %s limits: %w", sn.ID, err)
	}
	env, err := json.Marshal(nonNil(sn.Env))
	if err != nil {
		return fmt.Errorf("encoding snapshot %s env: %w", sn.ID, err)
	}
	meta, err := json.Marshal(nonNil(sn.Metadata))
	if err != nil {
		return fmt.Errorf("encoding snapshot %s metadata: %w", sn.ID, err)
	}
	_, err = s.pool.Exec(ctx, `INSERT INTO snapshots (`+snapshotColumns+`)
		VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8, $9, $10::jsonb, $11::jsonb, $12, $13, $14, $15, $16)`,
		sn.ID, sn.Name, sn.Owner, string(sn.Source), sn.Template, sn.Runtime, string(limits), sn.User, sn.Workdir,
		string(env), string(meta), sn.SizeBytes, sn.Node, sn.CreatedAt, sn.Build, sn.Image)
	if isUniqueViolation(err) {
		return fmt.Errorf("snapshot %q: %w", sn.Name, errdefs.ErrAlreadyExists)
	}
	if err != nil {
		return fmt.Errorf("writing snapshot %s: %w", sn.ID, err)
	}
	return nil
}

// GetSnapshot returns owner's snapshot called name.
func (s *Store) GetSnapshot(ctx context.Context, owner, name string) (sandbox.Snapshot, error) {
	row := s.pool.QueryRow(ctx, `SELECT `+snapshotColumns+` FROM snapshots WHERE owner = $1 AND name = $2`, owner, name)
	sn, err := scanSnapshot(row)
	if notFound(err) {
		return sandbox.Snapshot{}, fmt.Errorf("snapshot %q: %w", name, errdefs.ErrNotFound)
	}
	if err != nil {
		return sandbox.Snapshot{}, fmt.Errorf("reading snapshot %q: %w", name, err)
	}
	return sn, nil
}

// ListSnapshots returns owner's snapshots ("" for every owner's), oldest
// first.
func (s *Store) ListSnapshots(ctx context.Context, owner string) ([]sandbox.Snapshot, error) {
	w, args := where(eq{"owner", owner})
	return queryAll(ctx, s.pool, "snapshots", scanSnapshot, `SELECT `+snapshotColumns+` FROM snapshots`+w+`
		ORDER BY created_at, id`, args...)
}

// DeleteSnapshot removes a snapshot record; deleting a missing one
// succeeds.
func (s *Store) DeleteSnapshot(ctx context.Context, id string) error {
	if _, err := s.pool.Exec(ctx, `DELETE FROM snapshots WHERE id = $1`, id); err != nil {
		return fmt.Errorf("deleting snapshot %s: %w", id, err)
	}
	return nil
}

func scanSnapshot(row scanner) (sandbox.Snapshot, error) {
	var (
		sn                sandbox.Snapshot
		source            string
		limits, env, meta []byte
	)
	if err := row.Scan(&sn.ID, &sn.Name, &sn.Owner, &source, &sn.Template, &sn.Runtime, &limits, &sn.User, &sn.Workdir,
		&env, &meta, &sn.SizeBytes, &sn.Node, &sn.CreatedAt, &sn.Build, &sn.Image); err != nil {
		return sn, err
	}
	sn.Source, sn.CreatedAt = sandbox.ID(source), sn.CreatedAt.UTC()
	if err := json.Unmarshal(limits, &sn.Limits); err != nil {
		return sn, fmt.Errorf("decoding snapshot %s limits: %w", sn.ID, err)
	}
	if err := decodeMap(env, &sn.Env); err != nil {
		return sn, fmt.Errorf("decoding snapshot %s env: %w", sn.ID, err)
	}
	if err := decodeMap(meta, &sn.Metadata); err != nil {
		return sn, fmt.Errorf("decoding snapshot %s metadata: %w", sn.ID, err)
	}
	return sn, nil
}
