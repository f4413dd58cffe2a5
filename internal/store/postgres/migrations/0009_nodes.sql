-- The cluster's node registry (internal/cluster, docs/cluster.md): every
-- kiln serve of role node heartbeats its row; a silent one is marked
-- lost. Times are the database's clock, so hosts' clocks may disagree.
CREATE TABLE nodes (
	name         text COLLATE "C" NOT NULL PRIMARY KEY,
	url          text             NOT NULL,
	state        text             NOT NULL,
	reason       text             NOT NULL,
	cpus         double precision NOT NULL,
	memory_bytes bigint           NOT NULL,
	slots        integer          NOT NULL,
	runtimes     jsonb            NOT NULL,
	templates    jsonb            NOT NULL,
	started_at   timestamptz      NOT NULL,
	heartbeat_at timestamptz      NOT NULL
);

-- Placements admitted on a node by a front and not yet released: they
-- count against its slots, and against their owner's quota across the
-- cluster, until the create has its record (or expires).
CREATE TABLE node_reservations (
	id           text COLLATE "C" NOT NULL PRIMARY KEY,
	node         text COLLATE "C" NOT NULL REFERENCES nodes (name) ON DELETE CASCADE,
	owner        text        NOT NULL,
	memory_bytes bigint      NOT NULL,
	expires_at   timestamptz NOT NULL
);
CREATE INDEX node_reservations_by_owner ON node_reservations (owner, expires_at);
CREATE INDEX sandboxes_by_owner_state ON sandboxes (owner, state);
CREATE INDEX node_reservations_by_node ON node_reservations (node, expires_at);
CREATE INDEX sandboxes_by_node_state ON sandboxes (node, state);
