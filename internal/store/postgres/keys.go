package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/kiln-sh/kiln/internal/apikey"
	"github.com/kiln-sh/kiln/internal/errdefs"
)

const keyColumns = `id, name, prefix, hash, admin, created_at, revoked_at, max_sandboxes, max_memory_bytes`

// CreateKey stores a new key; errdefs.ErrAlreadyExists if its id or hash
// is taken.
func (s *Store) CreateKey(ctx context.Context, k apikey.Key) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO api_keys (`+keyColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
		k.ID, k.Name, k.Prefix, nonNilBytes(k.Hash), k.Admin, k.CreatedAt, nullTime(k.RevokedAt),
		int64(k.MaxSandboxes), k.MaxMemoryBytes)
	if isUniqueViolation(err) {
		return fmt.Errorf("creating key %s: %w", k.ID, errdefs.ErrAlreadyExists)
	}
	if err != nil {
		return fmt.Errorf("creating key %s: %w", k.ID, err)
	}
	return nil
}

// KeyByHash finds a key by its secret's hash; errdefs.ErrNotFound if none.
func (s *Store) KeyByHash(ctx context.Context, hash []byte) (apikey.Key, error) {
	k, err := scanKey(s.pool.QueryRow(ctx, `SELECT `+keyColumns+` FROM api_keys WHERE hash = $1`, nonNilBytes(hash)))
	if notFound(err) {
		return apikey.Key{}, fmt.Errorf("key: %w", errdefs.ErrNotFound)
	}
	if err != nil {
		return apikey.Key{}, fmt.Errorf("reading key: %w", err)
	}
	return k, nil
}

// ListKeys returns all keys, revoked ones included, oldest first.
func (s *Store) ListKeys(ctx context.Context) ([]apikey.Key, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+keyColumns+` FROM api_keys ORDER BY created_at, id`)
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
	tag, err := s.pool.Exec(ctx, `UPDATE api_keys SET revoked_at = coalesce(revoked_at, $1) WHERE id = $2`, at, id)
	return affected(tag, err, "revoking key "+id, "key "+id)
}

func scanKey(row scanner) (apikey.Key, error) {
	var (
		k       apikey.Key
		maxSB   int64
		revoked *time.Time
	)
	if err := row.Scan(&k.ID, &k.Name, &k.Prefix, &k.Hash, &k.Admin, &k.CreatedAt, &revoked,
		&maxSB, &k.MaxMemoryBytes); err != nil {
		return k, err
	}
	k.MaxSandboxes = int(maxSB)
	k.CreatedAt = k.CreatedAt.UTC()
	if revoked != nil {
		k.RevokedAt = revoked.UTC()
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
