package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/store/page"
)

const sandboxColumns = `id, template, runtime, state, reason, limits, user_name, workdir,
	env, metadata, owner, node, created_at, expires_at, auto_pause, timeout_ms, paused_at, auto_resume, ended_at, build, volumes, image`

// PutSandbox inserts or replaces a record. Times are kept to the
// microsecond, in UTC. An ended record is stored without env and metadata
// (see sandbox.Store).
func (s *Store) PutSandbox(ctx context.Context, sb sandbox.Sandbox) error {
	if sb.State.Terminal() {
		sb = sb.Ended(sb.State, "", time.Now())
	}
	limits, env, meta, err := encodeMaps(sb)
	if err != nil {
		return err
	}
	vols, err := encodeVolumes(sb)
	if err != nil {
		return err
	}
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("beginning sandbox write: %w", err)
	}
	defer tx.Rollback()
	if !sb.State.Terminal() {
		// A new record takes the place of one reservation its owner holds
		// on its node (a cluster front's placement, internal/cluster), in
		// the same transaction: counted once, never twice nor not at all.
		// One statement, before the upsert: a record already there takes
		// nothing.
		if _, err := tx.ExecContext(ctx, `DELETE FROM node_reservations WHERE id = (
			SELECT id FROM node_reservations WHERE node = ? AND owner = ? ORDER BY expires_at LIMIT 1)
			AND NOT EXISTS (SELECT 1 FROM sandboxes WHERE id = ?)`, sb.Node, sb.Owner, string(sb.ID)); err != nil {
			return fmt.Errorf("writing sandbox %s: %w", sb.ID, err)
		}
	}
	// An upsert, not INSERT OR REPLACE: replacing would delete the row and
	// cascade to its metadata mid-statement.
	_, err = tx.ExecContext(ctx, `INSERT INTO sandboxes (`+sandboxColumns+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET template = excluded.template, runtime = excluded.runtime,
			state = excluded.state, reason = excluded.reason, limits = excluded.limits,
			user_name = excluded.user_name, workdir = excluded.workdir, env = excluded.env,
			metadata = excluded.metadata, owner = excluded.owner, node = excluded.node,
			created_at = excluded.created_at, expires_at = excluded.expires_at,
			auto_pause = excluded.auto_pause, timeout_ms = excluded.timeout_ms, paused_at = excluded.paused_at,
			auto_resume = excluded.auto_resume, ended_at = excluded.ended_at, build = excluded.build,
			volumes = excluded.volumes, image = excluded.image`,
		string(sb.ID), sb.Template, sb.Runtime, string(sb.State), sb.Reason, limits, sb.User, sb.Workdir,
		env, meta, sb.Owner, sb.Node, micros(sb.CreatedAt), nullMicros(sb.ExpiresAt),
		sb.AutoPause, sb.Timeout.Milliseconds(), nullMicros(sb.PausedAt), sb.AutoResume, nullMicros(sb.EndedAt), sb.Build, vols, sb.Image)
	if err != nil {
		return fmt.Errorf("writing sandbox %s: %w", sb.ID, err)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM sandbox_metadata WHERE sandbox_id = ?`, string(sb.ID)); err != nil {
		return fmt.Errorf("writing sandbox %s metadata: %w", sb.ID, err)
	}
	for k, v := range sb.Metadata {
		if _, err := tx.ExecContext(ctx, `INSERT INTO sandbox_metadata (sandbox_id, key, value) VALUES (?, ?, ?)`,
			string(sb.ID), k, v); err != nil {
			return fmt.Errorf("writing sandbox %s metadata: %w", sb.ID, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("committing sandbox %s: %w", sb.ID, err)
	}
	return nil
}

// GetSandbox returns a record; errdefs.ErrNotFound if there is none.
func (s *Store) GetSandbox(ctx context.Context, id sandbox.ID) (sandbox.Sandbox, error) {
	row := s.r.QueryRowContext(ctx, `SELECT `+sandboxColumns+` FROM sandboxes WHERE id = ?`, string(id))
	sb, err := scanSandbox(row)
	if errors.Is(err, sql.ErrNoRows) {
		return sandbox.Sandbox{}, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return sandbox.Sandbox{}, fmt.Errorf("reading sandbox %s: %w", id, err)
	}
	return sb, nil
}

// ListSandboxes returns records matching f, oldest first (newest first
// with f.Desc), one page at a time; the returned token fetches the next
// page ("" at the end).
func (s *Store) ListSandboxes(ctx context.Context, f sandbox.Filter) ([]sandbox.Sandbox, string, error) {
	size, err := page.Size(f.Limit)
	if err != nil {
		return nil, "", err
	}
	after, ok, err := page.Decode(f.Token)
	if err != nil {
		return nil, "", err
	}
	var where []string
	var args []any
	cmp, order := `>`, `created_at, id`
	if f.Desc {
		cmp, order = `<`, `created_at DESC, id DESC`
	}
	if ok {
		where = append(where, `(created_at, id) `+cmp+` (?, ?)`)
		args = append(args, micros(after.CreatedAt), after.ID)
	}
	if f.Template != "" {
		where = append(where, `template = ?`)
		args = append(args, f.Template)
	}
	if !f.CreatedAfter.IsZero() {
		where = append(where, `created_at > ?`)
		args = append(args, micros(f.CreatedAfter))
	}
	if f.Owner != "" {
		where = append(where, `owner = ?`)
		args = append(args, f.Owner)
	}
	if f.Node != "" {
		where = append(where, `node = ?`)
		args = append(args, f.Node)
	}
	if len(f.States) > 0 {
		where = append(where, `state IN (?`+strings.Repeat(`, ?`, len(f.States)-1)+`)`)
		for _, st := range f.States {
			args = append(args, string(st))
		}
	}
	for k, v := range f.Metadata {
		where = append(where, `id IN (SELECT sandbox_id FROM sandbox_metadata WHERE key = ? AND value = ?)`)
		args = append(args, k, v)
	}
	q := `SELECT ` + sandboxColumns + ` FROM sandboxes`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, ` AND `)
	}
	q += ` ORDER BY ` + order + ` LIMIT ?`
	args = append(args, size+1) // one more tells whether there is a next page

	rows, err := s.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, "", fmt.Errorf("listing sandboxes: %w", err)
	}
	defer rows.Close()
	var out []sandbox.Sandbox
	for rows.Next() {
		sb, err := scanSandbox(rows)
		if err != nil {
			return nil, "", fmt.Errorf("listing sandboxes: %w", err)
		}
		out = append(out, sb)
	}
	if err := rows.Err(); err != nil {
		return nil, "", fmt.Errorf("listing sandboxes: %w", err)
	}
	if len(out) <= size {
		return out, "", nil
	}
	out = out[:size]
	last := out[size-1]
	return out, page.Encode(page.Key{CreatedAt: last.CreatedAt, ID: string(last.ID)}), nil
}

// DeleteEnded removes up to limit records of sandboxes that ended before
// before, oldest end first; their metadata rows go with them (ON DELETE
// CASCADE).
func (s *Store) DeleteEnded(ctx context.Context, before time.Time, limit int) (int, error) {
	res, err := s.w.ExecContext(ctx, `DELETE FROM sandboxes WHERE id IN (
		SELECT id FROM sandboxes WHERE ended_at < ? AND state IN (?, ?) ORDER BY ended_at LIMIT ?)`,
		micros(before), string(sandbox.StateStopped), string(sandbox.StateFailed), limit)
	if err != nil {
		return 0, fmt.Errorf("deleting ended sandboxes: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("deleting ended sandboxes: %w", err)
	}
	return int(n), nil
}

// DeleteSandbox removes a record; deleting a missing one succeeds.
func (s *Store) DeleteSandbox(ctx context.Context, id sandbox.ID) error {
	if _, err := s.w.ExecContext(ctx, `DELETE FROM sandboxes WHERE id = ?`, string(id)); err != nil {
		return fmt.Errorf("deleting sandbox %s: %w", id, err)
	}
	return nil
}

func encodeMaps(sb sandbox.Sandbox) (limits, env, meta string, err error) {
	l, err := json.Marshal(sb.Limits)
	if err != nil {
		return "", "", "", fmt.Errorf("encoding sandbox %s limits: %w", sb.ID, err)
	}
	e, err := json.Marshal(nonNil(sb.Env))
	if err != nil {
		return "", "", "", fmt.Errorf("encoding sandbox %s env: %w", sb.ID, err)
	}
	m, err := json.Marshal(nonNil(sb.Metadata))
	if err != nil {
		return "", "", "", fmt.Errorf("encoding sandbox %s metadata: %w", sb.ID, err)
	}
	return string(l), string(e), string(m), nil
}

func nonNil(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

type scanner interface{ Scan(dest ...any) error }

func scanSandbox(row scanner) (sandbox.Sandbox, error) {
	var (
		sb                sandbox.Sandbox
		id, state         string
		limits, env, meta string
		created, timeout  int64
		expires, paused   sql.NullInt64
		ended             sql.NullInt64
		vols              string
	)
	if err := row.Scan(&id, &sb.Template, &sb.Runtime, &state, &sb.Reason, &limits, &sb.User, &sb.Workdir,
		&env, &meta, &sb.Owner, &sb.Node, &created, &expires, &sb.AutoPause, &timeout, &paused, &sb.AutoResume, &ended, &sb.Build, &vols, &sb.Image); err != nil {
		return sb, err
	}
	if ended.Valid {
		sb.EndedAt = fromMicros(ended.Int64)
	}
	sb.Timeout = time.Duration(timeout) * time.Millisecond
	if paused.Valid {
		sb.PausedAt = fromMicros(paused.Int64)
	}
	sb.ID, sb.State = sandbox.ID(id), sandbox.State(state)
	sb.CreatedAt = fromMicros(created)
	if expires.Valid {
		sb.ExpiresAt = fromMicros(expires.Int64)
	}
	if err := json.Unmarshal([]byte(limits), &sb.Limits); err != nil {
		return sb, fmt.Errorf("decoding sandbox %s limits: %w", id, err)
	}
	if err := decodeMap(env, &sb.Env); err != nil {
		return sb, fmt.Errorf("decoding sandbox %s env: %w", id, err)
	}
	if err := decodeMap(meta, &sb.Metadata); err != nil {
		return sb, fmt.Errorf("decoding sandbox %s metadata: %w", id, err)
	}
	if err := decodeVolumes([]byte(vols), &sb); err != nil {
		return sb, err
	}
	return sb, nil
}

// decodeMap leaves *m nil for an empty map: empty and nil maps read back
// alike, as nil.
func decodeMap(s string, m *map[string]string) error {
	if s == "{}" {
		return nil
	}
	if err := json.Unmarshal([]byte(s), m); err != nil {
		return err
	}
	if len(*m) == 0 {
		*m = nil
	}
	return nil
}

func micros(t time.Time) int64 { return t.UnixMicro() }

func nullMicros(t time.Time) sql.NullInt64 {
	if t.IsZero() {
		return sql.NullInt64{}
	}
	return sql.NullInt64{Int64: t.UnixMicro(), Valid: true}
}

func fromMicros(us int64) time.Time { return time.UnixMicro(us).UTC() }
