package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
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
	limits, err := json.Marshal(sb.Limits)
	if err != nil {
		return fmt.Errorf("encoding sandbox %s limits: %w", sb.ID, err)
	}
	env, err := json.Marshal(nonNil(sb.Env))
	if err != nil {
		return fmt.Errorf("encoding sandbox %s env: %w", sb.ID, err)
	}
	meta, err := json.Marshal(nonNil(sb.Metadata))
	if err != nil {
		return fmt.Errorf("encoding sandbox %s metadata: %w", sb.ID, err)
	}
	vols, err := encodeVolumes(sb)
	if err != nil {
		return err
	}
	// A new record takes the place of one reservation its owner holds on
	// its node (a cluster front's placement, internal/cluster), in the
	// same statement: counted once, never twice nor not at all.
	_, err = s.pool.Exec(ctx, `WITH put AS (INSERT INTO sandboxes (`+sandboxColumns+`)
		VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7, $8, $9::jsonb, $10::jsonb, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21::jsonb, $23)
		ON CONFLICT (id) DO UPDATE SET template = excluded.template, runtime = excluded.runtime,
			state = excluded.state, reason = excluded.reason, limits = excluded.limits,
			user_name = excluded.user_name, workdir = excluded.workdir, env = excluded.env,
			metadata = excluded.metadata, owner = excluded.owner, node = excluded.node,
			created_at = excluded.created_at, expires_at = excluded.expires_at,
			auto_pause = excluded.auto_pause, timeout_ms = excluded.timeout_ms, paused_at = excluded.paused_at,
			auto_resume = excluded.auto_resume, ended_at = excluded.ended_at, build = excluded.build,
			volumes = excluded.volumes, image = excluded.image
		RETURNING xmax = 0 AS inserted)
		DELETE FROM node_reservations WHERE id = (
			SELECT r.id FROM node_reservations r, put WHERE put.inserted AND $22 AND r.node = $12 AND r.owner = $11
			ORDER BY r.expires_at LIMIT 1)`,
		string(sb.ID), sb.Template, sb.Runtime, string(sb.State), sb.Reason, string(limits), sb.User, sb.Workdir,
		string(env), string(meta), sb.Owner, sb.Node, sb.CreatedAt, nullTime(sb.ExpiresAt),
		sb.AutoPause, sb.Timeout.Milliseconds(), nullTime(sb.PausedAt), sb.AutoResume, nullTime(sb.EndedAt), sb.Build, vols,
		!sb.State.Terminal(), sb.Image)
	if err != nil {
		return fmt.Errorf("writing sandbox %s: %w", sb.ID, err)
	}
	return nil
}

// GetSandbox returns a record; errdefs.ErrNotFound if there is none.
func (s *Store) GetSandbox(ctx context.Context, id sandbox.ID) (sandbox.Sandbox, error) {
	row := s.pool.QueryRow(ctx, `SELECT `+sandboxColumns+` FROM sandboxes WHERE id = $1`, string(id))
	sb, err := scanSandbox(row)
	if notFound(err) {
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
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	cmp, order := `>`, `created_at, id`
	if f.Desc {
		cmp, order = `<`, `created_at DESC, id DESC`
	}
	if ok {
		where = append(where, `(created_at, id) `+cmp+` (`+arg(after.CreatedAt)+`, `+arg(after.ID)+`)`)
	}
	if f.Template != "" {
		where = append(where, `template = `+arg(f.Template))
	}
	if !f.CreatedAfter.IsZero() {
		where = append(where, `created_at > `+arg(f.CreatedAfter.Truncate(time.Microsecond)))
	}
	if f.Owner != "" {
		where = append(where, `owner = `+arg(f.Owner))
	}
	if f.Node != "" {
		where = append(where, `node = `+arg(f.Node))
	}
	if len(f.States) > 0 {
		states := make([]string, len(f.States))
		for i, st := range f.States {
			states[i] = string(st)
		}
		where = append(where, `state = ANY(`+arg(states)+`::text[])`)
	}
	if len(f.Metadata) > 0 {
		meta, err := json.Marshal(f.Metadata)
		if err != nil {
			return nil, "", fmt.Errorf("encoding metadata filter: %w", err)
		}
		where = append(where, `metadata @> `+arg(string(meta))+`::jsonb`)
	}
	q := `SELECT ` + sandboxColumns + ` FROM sandboxes`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, ` AND `)
	}
	q += ` ORDER BY ` + order + ` LIMIT ` + arg(size+1) // one more tells whether there is a next page

	rows, err := s.pool.Query(ctx, q, args...)
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
// before, oldest end first.
func (s *Store) DeleteEnded(ctx context.Context, before time.Time, limit int) (int, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM sandboxes WHERE id IN (
		SELECT id FROM sandboxes WHERE ended_at < $1 AND state = ANY($2::text[]) ORDER BY ended_at LIMIT $3)`,
		before, []string{string(sandbox.StateStopped), string(sandbox.StateFailed)}, limit)
	if err != nil {
		return 0, fmt.Errorf("deleting ended sandboxes: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// DeleteSandbox removes a record; deleting a missing one succeeds.
func (s *Store) DeleteSandbox(ctx context.Context, id sandbox.ID) error {
	if _, err := s.pool.Exec(ctx, `DELETE FROM sandboxes WHERE id = $1`, string(id)); err != nil {
		return fmt.Errorf("deleting sandbox %s: %w", id, err)
	}
	return nil
}

type scanner interface{ Scan(dest ...any) error }

func scanSandbox(row scanner) (sandbox.Sandbox, error) {
	var (
		sb                sandbox.Sandbox
		id, state         string
		limits, env, meta []byte
		expires, paused   *time.Time
		ended             *time.Time
		timeout           int64
		vols              []byte
	)
	if err := row.Scan(&id, &sb.Template, &sb.Runtime, &state, &sb.Reason, &limits, &sb.User, &sb.Workdir,
		&env, &meta, &sb.Owner, &sb.Node, &sb.CreatedAt, &expires, &sb.AutoPause, &timeout, &paused, &sb.AutoResume, &ended, &sb.Build, &vols, &sb.Image); err != nil {
		return sb, err
	}
	if ended != nil {
		sb.EndedAt = ended.UTC()
	}
	sb.ID, sb.State = sandbox.ID(id), sandbox.State(state)
	sb.CreatedAt = sb.CreatedAt.UTC()
	if expires != nil {
		sb.ExpiresAt = expires.UTC()
	}
	if paused != nil {
		sb.PausedAt = paused.UTC()
	}
	sb.Timeout = time.Duration(timeout) * time.Millisecond
	if err := json.Unmarshal(limits, &sb.Limits); err != nil {
		return sb, fmt.Errorf("decoding sandbox %s limits: %w", id, err)
	}
	if err := decodeMap(env, &sb.Env); err != nil {
		return sb, fmt.Errorf("decoding sandbox %s env: %w", id, err)
	}
	if err := decodeMap(meta, &sb.Metadata); err != nil {
		return sb, fmt.Errorf("decoding sandbox %s metadata: %w", id, err)
	}
	if err := decodeVolumes(vols, &sb); err != nil {
		return sb, err
	}
	return sb, nil
}

// decodeMap leaves *m nil for an empty map: empty and nil maps read back
// alike, as nil.
func decodeMap(b []byte, m *map[string]string) error {
	if err := json.Unmarshal(b, m); err != nil {
		return err
	}
	if len(*m) == 0 {
		*m = nil
	}
	return nil
}

func nonNil(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}
