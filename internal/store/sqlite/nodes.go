package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kiln-sh/kiln/internal/cluster"
	"github.com/kiln-sh/kiln/internal/errdefs"
)

var _ cluster.Store = (*Store)(nil)

// active is cluster.Active as an SQL list.
var active = `('` + strings.Join(cluster.Active, `', '`) + `')`

// Heartbeat records n as live now, in one write transaction with the
// read of its previous state.
func (s *Store) Heartbeat(ctx context.Context, n cluster.Node) (bool, error) {
	runtimes, templates, builds := n.JSONLists()
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("writing node %s heartbeat: %w", n.Name, err)
	}
	defer tx.Rollback()
	var prev string
	if err := tx.QueryRowContext(ctx, `SELECT state FROM nodes WHERE name = ?`, n.Name).Scan(&prev); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return false, fmt.Errorf("writing node %s heartbeat: %w", n.Name, err)
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO nodes (name, url, state, reason, cpus, memory_bytes, slots, runtimes, templates, builds, started_at, heartbeat_at,
			disk_bytes, disk_free_bytes)
		VALUES (?, ?, ?, '', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (name) DO UPDATE SET url = excluded.url, state = excluded.state, reason = '', cpus = excluded.cpus,
			memory_bytes = excluded.memory_bytes, slots = excluded.slots, runtimes = excluded.runtimes,
			disk_bytes = excluded.disk_bytes, disk_free_bytes = excluded.disk_free_bytes,
			templates = excluded.templates, builds = excluded.builds, started_at = excluded.started_at, heartbeat_at = excluded.heartbeat_at`,
		n.Name, n.URL, n.BeatState(), n.CPUs, n.MemoryBytes, n.Slots, runtimes, templates, builds, micros(n.StartedAt), micros(time.Now()),
		n.DiskBytes, n.DiskFreeBytes)
	if err != nil {
		return false, fmt.Errorf("writing node %s heartbeat: %w", n.Name, err)
	}
	if err := tx.Commit(); err != nil {
		return false, fmt.Errorf("writing node %s heartbeat: %w", n.Name, err)
	}
	return prev == cluster.NodeLost, nil
}

// Nodes returns every node with its load.
func (s *Store) Nodes(ctx context.Context) ([]cluster.Node, error) {
	return queryAll(ctx, s.r, "nodes", scanNode, `SELECT n.name, n.url, n.state, n.reason, n.cpus, n.memory_bytes,
		n.slots, n.runtimes, n.templates, n.builds, n.started_at, n.heartbeat_at, n.pools, n.pools_at,
		n.disk_bytes, n.disk_free_bytes,
		coalesce(a.count, 0), coalesce(a.cpus, 0), coalesce(a.memory, 0),
		(SELECT count(*) FROM node_reservations r WHERE r.node = n.name AND r.expires_at > ?)
		FROM nodes n LEFT JOIN (
			SELECT node, count(*) AS count, sum(json_extract(limits, '$.cpus')) AS cpus,
				sum(json_extract(limits, '$.memory_bytes')) AS memory
			FROM sandboxes WHERE state IN `+active+` GROUP BY node) a ON a.node = n.name
		ORDER BY n.name`, micros(time.Now()))
}

func scanNode(row scanner) (cluster.Node, error) {
	var (
		n                           cluster.Node
		runtimes, templates, builds string
		started, heartbeat          int64
		pools                       string
		poolsAt                     sql.NullInt64
	)
	if err := row.Scan(&n.Name, &n.URL, &n.State, &n.Reason, &n.CPUs, &n.MemoryBytes, &n.Slots, &runtimes, &templates, &builds,
		&started, &heartbeat, &pools, &poolsAt, &n.DiskBytes, &n.DiskFreeBytes, &n.Sandboxes, &n.AllocatedCPUs, &n.AllocatedMemoryBytes, &n.Reserved); err != nil {
		return n, err
	}
	n.StartedAt, n.HeartbeatAt = fromMicros(started), fromMicros(heartbeat)
	n.ReadAt = time.Now()
	n.Quiet = n.ReadAt.Sub(n.HeartbeatAt) // one machine: one clock
	if poolsAt.Valid {
		n.PoolsAt = fromMicros(poolsAt.Int64)
	}
	return n, n.DecodeJSON([]byte(runtimes), []byte(templates), []byte(builds), []byte(pools))
}

// movable leaves out of a lost node's sandboxes those that another node
// can resume: paused, with their image in the shared snapshot dir.
const movable = `NOT (state = 'paused' AND image <> '')`

// MarkLost marks silent nodes lost, with their sandboxes (but those
// another node can resume), in one write transaction (BEGIN IMMEDIATE:
// sweepers take turns).
func (s *Store) MarkLost(ctx context.Context, silence time.Duration) ([]cluster.Node, error) {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("marking lost nodes: %w", err)
	}
	defer tx.Rollback()
	now := time.Now()
	rows, err := tx.QueryContext(ctx, `SELECT name, heartbeat_at FROM nodes WHERE state IN ('live', 'draining') AND heartbeat_at < ? ORDER BY name`,
		micros(now.Add(-silence)))
	if err != nil {
		return nil, fmt.Errorf("finding silent nodes: %w", err)
	}
	var lost []cluster.Node
	for rows.Next() {
		var (
			n    cluster.Node
			last int64
		)
		if err := rows.Scan(&n.Name, &last); err != nil {
			rows.Close()
			return nil, fmt.Errorf("finding silent nodes: %w", err)
		}
		n.HeartbeatAt = fromMicros(last)
		lost = append(lost, n)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("finding silent nodes: %w", err)
	}
	for i := range lost {
		n := &lost[i]
		n.State, n.Reason = cluster.NodeLost, cluster.LostReason(n.Name, n.HeartbeatAt, silence)
		if _, err := tx.ExecContext(ctx, `UPDATE nodes SET state = 'lost', reason = ? WHERE name = ?`, n.Reason, n.Name); err != nil {
			return nil, fmt.Errorf("marking node %s lost: %w", n.Name, err)
		}
		// As PutSandbox stores an ended record: a tombstone without env
		// and metadata.
		if _, err := tx.ExecContext(ctx, `DELETE FROM sandbox_metadata WHERE sandbox_id IN (
			SELECT id FROM sandboxes WHERE node = ? AND state IN `+active+` AND `+movable+`)`, n.Name); err != nil {
			return nil, fmt.Errorf("marking node %s sandboxes lost: %w", n.Name, err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE sandboxes SET state = 'failed', reason = ?, ended_at = ?,
			env = '{}', metadata = '{}', image = '' WHERE node = ? AND state IN `+active+` AND `+movable,
			n.Reason, micros(now), n.Name); err != nil {
			return nil, fmt.Errorf("marking node %s sandboxes lost: %w", n.Name, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("marking lost nodes: %w", err)
	}
	return lost, nil
}

// Reserve admits one more sandbox inside one write transaction (BEGIN
// IMMEDIATE: reservations are counted one after another).
func (s *Store) Reserve(ctx context.Context, r cluster.Reservation, ttl time.Duration) (string, error) {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return "", fmt.Errorf("reserving on node %s: %w", r.Node, err)
	}
	defer tx.Rollback()
	now := micros(time.Now())
	if r.MaxSandboxes > 0 || r.MaxMemoryBytes > 0 {
		var (
			n   int
			mem int64
		)
		if err := tx.QueryRowContext(ctx, `SELECT
			(SELECT count(*) FROM sandboxes WHERE owner = ? AND state IN `+active+`) +
			(SELECT count(*) FROM node_reservations WHERE owner = ? AND expires_at > ?),
			(SELECT coalesce(sum(json_extract(limits, '$.memory_bytes')), 0) FROM sandboxes WHERE owner = ? AND state IN `+active+`) +
			(SELECT coalesce(sum(memory_bytes), 0) FROM node_reservations WHERE owner = ? AND expires_at > ?)`,
			r.Owner, r.Owner, now, r.Owner, r.Owner, now).Scan(&n, &mem); err != nil {
			return "", fmt.Errorf("counting the sandboxes of %s: %w", r.Owner, err)
		}
		if err := cluster.QuotaError(r, n, mem); err != nil {
			return "", err
		}
	}
	var (
		state string
		slots int
	)
	err = tx.QueryRowContext(ctx, `SELECT state, slots FROM nodes WHERE name = ?`, r.Node).Scan(&state, &slots)
	if errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("node %s: %w", r.Node, errdefs.ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("reserving on node %s: %w", r.Node, err)
	}
	var used int
	if err := tx.QueryRowContext(ctx, `SELECT
		(SELECT count(*) FROM sandboxes WHERE node = ? AND state IN `+active+`) +
		(SELECT count(*) FROM node_reservations WHERE node = ? AND expires_at > ?)`, r.Node, r.Node, now).Scan(&used); err != nil {
		return "", fmt.Errorf("counting node %s load: %w", r.Node, err)
	}
	if err := cluster.SlotError(r.Node, state, slots, used); err != nil {
		return "", err
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM node_reservations WHERE node = ? AND expires_at <= ?`, r.Node, now); err != nil {
		return "", fmt.Errorf("reserving on node %s: %w", r.Node, err)
	}
	id := cluster.NewReservationID()
	if _, err := tx.ExecContext(ctx, `INSERT INTO node_reservations (id, node, owner, memory_bytes, expires_at) VALUES (?, ?, ?, ?, ?)`,
		id, r.Node, r.Owner, r.MemoryBytes, now+ttl.Microseconds()); err != nil {
		return "", fmt.Errorf("reserving on node %s: %w", r.Node, err)
	}
	if err := tx.Commit(); err != nil {
		return "", fmt.Errorf("reserving on node %s: %w", r.Node, err)
	}
	return id, nil
}

// Release drops a reservation.
func (s *Store) Release(ctx context.Context, id string) error {
	if _, err := s.w.ExecContext(ctx, `DELETE FROM node_reservations WHERE id = ?`, id); err != nil {
		return fmt.Errorf("releasing reservation %s: %w", id, err)
	}
	return nil
}

// MoveSandbox moves a paused sandbox with a shared image from node from,
// which is not live, to node to, in one statement (a compare-and-swap).
func (s *Store) MoveSandbox(ctx context.Context, id, from, to string) error {
	res, err := s.w.ExecContext(ctx, `UPDATE sandboxes SET node = ? WHERE id = ? AND node = ? AND state = 'paused'
		AND image <> '' AND NOT EXISTS (SELECT 1 FROM nodes WHERE name = ? AND state IN ('live', 'draining'))`, to, id, from, from)
	if err != nil {
		return fmt.Errorf("moving sandbox %s to node %s: %w", id, to, err)
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return fmt.Errorf("moving sandbox %s from node %s: it is not paused there with a shared image, or the node is live: %w",
			id, from, errdefs.ErrFailedPrecondition)
	}
	return nil
}
