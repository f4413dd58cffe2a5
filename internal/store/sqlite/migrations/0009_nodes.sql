-- The cluster's node registry (internal/cluster, docs/cluster.md): every
-- kiln serve of role node heartbeats its row; a silent one is marked
-- lost. Times in microseconds since the epoch.
CREATE TABLE nodes (
	name         TEXT    NOT NULL PRIMARY KEY,
	url          TEXT    NOT NULL,
	state        TEXT    NOT NULL,
	reason       TEXT    NOT NULL,
	cpus         REAL    NOT NULL,
	memory_bytes INTEGER NOT NULL,
	slots        INTEGER NOT NULL,
	runtimes     TEXT    NOT NULL,
	templates    TEXT    NOT NULL,
	started_at   INTEGER NOT NULL,
	heartbeat_at INTEGER NOT NULL
) STRICT;

-- Placements admitted on a node by a front and not yet released: they
-- count against its slots, and against their owner's quota across the
-- cluster, until the create has its record (or expires).
CREATE TABLE node_reservations (
	id           TEXT    NOT NULL PRIMARY KEY,
	node         TEXT    NOT NULL REFERENCES nodes (name) ON DELETE CASCADE,
	owner        TEXT    NOT NULL,
	memory_bytes INTEGER NOT NULL,
	expires_at   INTEGER NOT NULL
) STRICT;
CREATE INDEX node_reservations_by_owner ON node_reservations (owner, expires_at);
CREATE INDEX sandboxes_by_owner_state ON sandboxes (owner, state);
CREATE INDEX node_reservations_by_node ON node_reservations (node, expires_at);
CREATE INDEX sandboxes_by_node_state ON sandboxes (node, state);
