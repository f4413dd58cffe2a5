package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

const snapshotColumns = `id, name, owner, source, template, runtime, limits, user_name, workdir,
	env, metadata, size_bytes, node, created_at, build, image`

// PutSnapshot inserts a snapshot record; errdefs.ErrAlreadyExists if its
// id, or its name for its owner, is taken.
func (s *Store) PutSnapshot(ctx context.Context, sn sandbox.Snapshot) error {
	limits, env, meta, err := encodeMaps(sandbox.Sandbox{ID: sandbox.ID(sn.ID), Limits: sn.Limits, Env: sn.Env, Metadata: sn.Metadata})
	if err != nil {
		return err
	}
	_, err = s.w.ExecContext(ctx, `INSERT INTO snapshots (`+snapshotColumns+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		sn.ID, sn.Name, sn.Owner, string(sn.Source), sn.Template, sn.Runtime, limits, sn.User, sn.Workdir,
		env, meta, sn.SizeBytes, sn.Node, micros(sn.CreatedAt), sn.Build, sn.Image)
	if isConstraint(err) {
		return fmt.Errorf("snapshot %q: %w", sn.Name, errdefs.ErrAlreadyExists)
	}
	if err != nil {
		return fmt.Errorf("writing snapshot %s: %w", sn.ID, err)
	}
	return nil
}

// GetSnapshot returns owner's snapshot called name.
func (s *Store) GetSnapshot(ctx context.Context, owner, name string) (sandbox.Snapshot, error) {
	row := s.r.QueryRowContext(ctx, `SELECT `+snapshotColumns+` FROM snapshots WHERE owner = ? AND name = ?`, owner, name)
	sn, err := scanSnapshot(row)
	if errors.Is(err, sql.ErrNoRows) {
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
	return queryAll(ctx, s.r, "snapshots", scanSnapshot, `SELECT `+snapshotColumns+` FROM snapshots`+w+`
		ORDER BY created_at, id`, args...)
}

// DeleteSnapshot removes a snapshot record; deleting a missing one
// succeeds.
func (s *Store) DeleteSnapshot(ctx context.Context, id string) error {
	if _, err := s.w.ExecContext(ctx, `DELETE FROM snapshots WHERE id = ?`, id); err != nil {
		return fmt.Errorf("deleting snapshot %s: %w", id, err)
	}
	return nil
}

func scanSnapshot(row scanner) (sandbox.Snapshot, error) {
	var (
		sn                sandbox.Snapshot
		source            string
		limits, env, meta string
		created           int64
	)
	if err := row.Scan(&sn.ID, &sn.Name, &sn.Owner, &source, &sn.Template, &sn.Runtime, &limits, &sn.User, &sn.Workdir,
		&env, &meta, &sn.SizeBytes, &sn.Node, &created, &sn.Build, &sn.Image); err != nil {
		return sn, err
	}
	sn.Source, sn.CreatedAt = sandbox.ID(source), fromMicros(created)
	if err := json.Unmarshal([]byte(limits), &sn.Limits); err != nil {
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
