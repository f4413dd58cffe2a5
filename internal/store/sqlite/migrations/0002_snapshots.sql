-- Auto-pause: paused instead of killed at expiry; timeout_ms is the
-- lifetime a resume starts over; paused_at bounds how long a sandbox stays
-- paused.
ALTER TABLE sandboxes ADD COLUMN auto_pause INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sandboxes ADD COLUMN timeout_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sandboxes ADD COLUMN paused_at INTEGER;

-- Named snapshots of sandboxes: a checkpoint and a layer image under
-- <data>/snapshots/<id>/. Names are unique per owner.
CREATE TABLE snapshots (
	id         TEXT    NOT NULL PRIMARY KEY,
	name       TEXT    NOT NULL,
	owner      TEXT    NOT NULL,
	source     TEXT    NOT NULL,
	template   TEXT    NOT NULL,
	runtime    TEXT    NOT NULL,
	limits     TEXT    NOT NULL,
	user_name  TEXT    NOT NULL,
	workdir    TEXT    NOT NULL,
	env        TEXT    NOT NULL,
	metadata   TEXT    NOT NULL,
	size_bytes INTEGER NOT NULL,
	node       TEXT    NOT NULL,
	created_at INTEGER NOT NULL,
	UNIQUE (owner, name)
) STRICT;
CREATE INDEX snapshots_by_owner ON snapshots (owner, created_at, id);
