package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/kiln-sh/kiln/internal/apikey"
	"github.com/kiln-sh/kiln/internal/errdefs"
)

const keyColumns = `id, name, prefix, hash, admin, created_at, revoked_at, max_sandboxes, max_memory_bytes`

// CreateKey stores a new key; errdefs.ErrAlreadyExists if its id or hash
// is taken.
func (s *Store) CreateKey(ctx context.Context, k apikey.Key) error {
	_, err := s.w.ExecContext(ctx, `INSERT INTO api_keys (`+keyColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		k.ID, k.Name, k.Prefix, nonNilBytes(k.Hash), k.Admin, micros(k.CreatedAt), nullMicros(k.RevokedAt),
		k.MaxSandboxes, k.MaxMemoryBytes)
	if isConstraint(err) {
		return fmt.Errorf("creating key %s: %w", k.ID, errdefs.ErrAlreadyExists)
	}
	if err != nil {
		return fmt.Errorf("creating key %s: %w", k.ID, err)
	}
	return nil
}

// KeyByHash finds a key by its secret's hash; errdefs.ErrNotFound if none.
func (s *Store) KeyByHash(ctx context.Context, hash []byte) (apikey.Key, error) {
	k, err := scanKey(s.r.QueryRowContext(ctx, `SELECT `+keyColumns+` FROM api_keys WHERE hash = ?`, nonNilBytes(hash)))
	if errors.Is(err, sql.ErrNoRows) {
		return apikey.Key{}, fmt.Errorf("key: %w", errdefs.ErrNotFound)
	}
	if err != nil {
		return apikey.Key{}, fmt.Errorf("reading key: %w", err)
	}
	return k, nil
}

// ListKeys returns all keys, revoked ones included, oldest first.
func (s *Store) ListKeys(ctx context.Context) ([]apikey.Key, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+keyColumns+` FROM api_keys ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("listing keys: %w", err)
	}
	defer rows.Close()
	var out []apikey.Key
	for rows.Next() {
		k, err := scanKey(rows)
		if err != nil {
			return nil, fmt.Errorf("listing keys: %w", err)
		}
		out = append(out, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing keys: %w", err)
	}
	return out, nil
}

// RevokeKey marks a key revoked; errdefs.ErrNotFound if unknown. Revoking
// a revoked key keeps the first revocation time.
func (s *Store) RevokeKey(ctx context.Context, id string, at time.Time) error {
	res, err := s.w.ExecContext(ctx, `UPDATE api_keys SET revoked_at = coalesce(revoked_at, ?) WHERE id = ?`,
		micros(at), id)
	return affected(res, err, "revoking key "+id, "key "+id)
}

func scanKey(row scanner) (apikey.Key, error) {
	var (
		k       apikey.Key
		created int64
		revoked sql.NullInt64
	)
	if err := row.Scan(&k.ID, &k.Name, &k.Prefix, &k.Hash, &k.Admin, &created, &revoked,
		&k.MaxSandboxes, &k.MaxMemoryBytes); err != nil {
		return k, err
	}
	k.CreatedAt = fromMicros(created)
	if revoked.Valid {
		k.RevokedAt = fromMicros(revoked.Int64)
	}
	return k, nil
}

// nonNilBytes keeps a nil hash from binding as NULL, which the NOT NULL
// column would refuse with a confusing error.
func nonNilBytes(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
