package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kiln-sh/kiln/internal/cluster"
	"github.com/kiln-sh/kiln/internal/errdefs"
)

var _ cluster.Store = (*Store)(nil)

// Heartbeat records n as live (or draining) now, on the database's clock.
// The row's previous state is read in the same statement.
func (s *Store) Heartbeat(ctx context.Context, n cluster.Node) (bool, error) {
	runtimes, templates, builds := n.JSONLists()
	var prev *string
	err := s.pool.QueryRow(ctx, `WITH prev AS (SELECT state FROM nodes WHERE name = $1)
		INSERT INTO nodes (name, url, state, reason, cpus, memory_bytes, slots, runtimes, templates, builds, started_at, heartbeat_at,
			disk_bytes, disk_free_bytes)
		VALUES ($1, $2, $10, '', $3, $4, $5, $6::jsonb, $7::jsonb, $9::jsonb, $8, now(), $11, $12)
		ON CONFLICT (name) DO UPDATE SET url = excluded.url, state = excluded.state, reason = '', cpus = excluded.cpus,
			memory_bytes = excluded.memory_bytes, slots = excluded.slots, runtimes = excluded.runtimes,
			disk_bytes = excluded.disk_bytes, disk_free_bytes = excluded.disk_free_bytes,
			templates = excluded.templates, builds = excluded.builds, started_at = excluded.started_at, heartbeat_at = now()
		RETURNING (SELECT state FROM prev)`,
		n.Name, n.URL, n.CPUs, n.MemoryBytes, n.Slots, runtimes, templates, n.StartedAt, builds, n.BeatState(),
		n.DiskBytes, n.DiskFreeBytes).Scan(&prev)
	if err != nil {
		return false, fmt.Errorf("writing node %s heartbeat: %w", n.Name, err)
	}
	return prev != nil && *prev == cluster.NodeLost, nil
}

// catalogStart is when the database (re)started, on its clock: a node's
// silence counts from its last heartbeat or from then, whichever is later,
// so the heartbeats nodes could not write while the database was down are
// not held against them.
const catalogStart = `pg_postmaster_start_time()`

// Nodes returns every node with its load.
func (s *Store) Nodes(ctx context.Context) ([]cluster.Node, error) {
	return queryAll(ctx, s.pool, "nodes", scanNode, `SELECT n.name, n.url, n.state, n.reason, n.cpus, n.memory_bytes,
		n.slots, n.runtimes, n.templates, n.builds, n.started_at, n.heartbeat_at,
		extract(epoch FROM now() - greatest(n.heartbeat_at, `+catalogStart+`))::float8, n.pools, n.pools_at,
		n.disk_bytes, n.disk_free_bytes,
		coalesce(a.count, 0), coalesce(a.cpus, 0), coalesce(a.memory, 0),
		(SELECT count(*) FROM node_reservations r WHERE r.node = n.name AND r.expires_at > now())
		FROM nodes n LEFT JOIN (
			SELECT node, count(*) AS count, sum((limits->>'cpus')::float8) AS cpus,
				sum((limits->>'memory_bytes')::bigint) AS memory
			FROM sandboxes WHERE state = ANY($1::text[]) GROUP BY node) a ON a.node = n.name
		ORDER BY n.name`, cluster.Active)
}

func scanNode(row scanner) (cluster.Node, error) {
	var (
		n                           cluster.Node
		runtimes, templates, builds []byte
		quiet                       float64
		pools                       []byte
		poolsAt                     *time.Time
	)
	if err := row.Scan(&n.Name, &n.URL, &n.State, &n.Reason, &n.CPUs, &n.MemoryBytes, &n.Slots, &runtimes, &templates, &builds,
		&n.StartedAt, &n.HeartbeatAt, &quiet, &pools, &poolsAt, &n.DiskBytes, &n.DiskFreeBytes, &n.Sandboxes, &n.AllocatedCPUs, &n.AllocatedMemoryBytes, &n.Reserved); err != nil {
		return n, err
	}
	n.StartedAt, n.HeartbeatAt = n.StartedAt.UTC(), n.HeartbeatAt.UTC()
	n.Quiet, n.ReadAt = time.Duration(quiet*float64(time.Second)), time.Now()
	if poolsAt != nil {
		n.PoolsAt = poolsAt.UTC()
	}
	return n, n.DecodeJSON(runtimes, templates, builds, pools)
}

// MarkLost marks silent nodes lost, with their sandboxes: live or draining
// nodes without a heartbeat for silence since they last wrote one or
// since the database started, whichever is later. The rows are
// taken FOR UPDATE SKIP LOCKED: a node another sweeper is marking (or
// whose heartbeat is being written) is left to it, so no node is marked
// twice and no sweeper waits on another.
func (s *Store) MarkLost(ctx context.Context, silence time.Duration) ([]cluster.Node, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("marking lost nodes: %w", err)
	}
	defer tx.Rollback(ctx)
	rows, err := tx.Query(ctx, `SELECT name, heartbeat_at FROM nodes
		WHERE state IN ('live', 'draining') AND greatest(heartbeat_at, `+catalogStart+`) < now() - make_interval(secs => $1)
		ORDER BY name FOR UPDATE SKIP LOCKED`, silence.Seconds())
	if err != nil {
		return nil, fmt.Errorf("finding silent nodes: %w", err)
	}
	lost, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (cluster.Node, error) {
		var n cluster.Node
		err := r.Scan(&n.Name, &n.HeartbeatAt)
		return n, err
	})
	if err != nil {
		return nil, fmt.Errorf("finding silent nodes: %w", err)
	}
	for i := range lost {
		n := &lost[i]
		n.State, n.Reason = cluster.NodeLost, cluster.LostReason(n.Name, n.HeartbeatAt, silence)
		if _, err := tx.Exec(ctx, `UPDATE nodes SET state = 'lost', reason = $2 WHERE name = $1`, n.Name, n.Reason); err != nil {
			return nil, fmt.Errorf("marking node %s lost: %w", n.Name, err)
		}
		// As PutSandbox stores an ended record: a tombstone without env
		// and metadata.
		// A paused sandbox with its image in the shared snapshot dir is
		// left paused: another node can resume it (MoveSandbox).
		if _, err := tx.Exec(ctx, `UPDATE sandboxes SET state = 'failed', reason = $2, ended_at = now(),
			env = '{}'::jsonb, metadata = '{}'::jsonb, image = '' WHERE node = $1 AND state = ANY($3::text[])
			AND NOT (state = 'paused' AND image <> '')`,
			n.Name, n.Reason, cluster.Active); err != nil {
			return nil, fmt.Errorf("marking node %s sandboxes lost: %w", n.Name, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("marking lost nodes: %w", err)
	}
	return lost, nil
}

// ownerLocks is the first key of the pg_advisory_xact_lock that
// serialises one owner's reservations (the second is a hash of the
// owner).
const ownerLocks = 0x6b6c6e71 // "klnq"

// Reserve admits one more sandbox under its owner's advisory lock (so the
// reservations of concurrent fronts for one owner are counted one after
// another) and the node row's lock (likewise for one node). Locks are
// taken owner first, node second, and nothing takes them the other way.
func (s *Store) Reserve(ctx context.Context, r cluster.Reservation, ttl time.Duration) (string, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return "", fmt.Errorf("reserving on node %s: %w", r.Node, err)
	}
	defer tx.Rollback(ctx)
	if r.MaxSandboxes > 0 || r.MaxMemoryBytes > 0 {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`, int32(ownerLocks), r.Owner); err != nil {
			return "", fmt.Errorf("locking the quota of %s: %w", r.Owner, err)
		}
		var (
			n   int
			mem int64
		)
		if err := tx.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM sandboxes WHERE owner = $1 AND state = ANY($2::text[])) +
			(SELECT count(*) FROM node_reservations WHERE owner = $1 AND expires_at > now()),
			(SELECT coalesce(sum((limits->>'memory_bytes')::bigint), 0) FROM sandboxes WHERE owner = $1 AND state = ANY($2::text[])) +
			(SELECT coalesce(sum(memory_bytes), 0) FROM node_reservations WHERE owner = $1 AND expires_at > now())`,
			r.Owner, cluster.Active).Scan(&n, &mem); err != nil {
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
	err = tx.QueryRow(ctx, `SELECT state, slots FROM nodes WHERE name = $1 FOR UPDATE`, r.Node).Scan(&state, &slots)
	if notFound(err) {
		return "", fmt.Errorf("node %s: %w", r.Node, errdefs.ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("reserving on node %s: %w", r.Node, err)
	}
	var used int
	if err := tx.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM sandboxes WHERE node = $1 AND state = ANY($2::text[])) +
		(SELECT count(*) FROM node_reservations WHERE node = $1 AND expires_at > now())`,
		r.Node, cluster.Active).Scan(&used); err != nil {
		return "", fmt.Errorf("counting node %s load: %w", r.Node, err)
	}
	if err := cluster.SlotError(r.Node, state, slots, used); err != nil {
		return "", err
	}
	id := cluster.NewReservationID()
	if _, err := tx.Exec(ctx, `DELETE FROM node_reservations WHERE node = $1 AND expires_at <= now()`, r.Node); err != nil {
		return "", fmt.Errorf("reserving on node %s: %w", r.Node, err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO node_reservations (id, node, owner, memory_bytes, expires_at)
		VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5))`,
		id, r.Node, r.Owner, r.MemoryBytes, ttl.Seconds()); err != nil {
		return "", fmt.Errorf("reserving on node %s: %w", r.Node, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return "", fmt.Errorf("reserving on node %s: %w", r.Node, err)
	}
	return id, nil
}

// Release drops a reservation.
func (s *Store) Release(ctx context.Context, id string) error {
	if _, err := s.pool.Exec(ctx, `DELETE FROM node_reservations WHERE id = $1`, id); err != nil {
		return fmt.Errorf("releasing reservation %s: %w", id, err)
	}
	return nil
}

// MoveSandbox moves a paused sandbox with a shared image from node from,
// which is not live, to node to, in one statement (a compare-and-swap).
// The node row is read in the same statement; a heartbeat that makes it
// live again concurrently is ordered with it by the row lock.
func (s *Store) MoveSandbox(ctx context.Context, id, from, to string) error {
	tag, err := s.pool.Exec(ctx, `UPDATE sandboxes SET node = $3 WHERE id = $1 AND node = $2 AND state = 'paused'
		AND image <> '' AND NOT EXISTS (SELECT 1 FROM nodes WHERE name = $2 AND state IN ('live', 'draining') FOR SHARE)`, id, from, to)
	if err != nil {
		return fmt.Errorf("moving sandbox %s to node %s: %w", id, to, err)
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("moving sandbox %s from node %s: it is not paused there with a shared image, or the node is live: %w",
			id, from, errdefs.ErrFailedPrecondition)
	}
	return nil
}
