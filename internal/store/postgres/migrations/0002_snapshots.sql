-- Auto-pause: paused instead of killed at expiry; timeout_ms is the
-- lifetime a resume starts over; paused_at bounds how long a sandbox stays
-- paused.
ALTER TABLE sandboxes ADD COLUMN auto_pause boolean NOT NULL DEFAULT false;
ALTER TABLE sandboxes ADD COLUMN timeout_ms bigint NOT NULL DEFAULT 0;
ALTER TABLE sandboxes ADD COLUMN paused_at timestamptz;

-- Named snapshots of sandboxes: a checkpoint and a layer image under
-- <data>/snapshots/<id>/. Names are unique per owner.
CREATE TABLE snapshots (
	id         text COLLATE "C" NOT NULL PRIMARY KEY,
	name       text        NOT NULL,
	owner      text        NOT NULL,
	source     text        NOT NULL,
	template   text        NOT NULL,
	runtime    text        NOT NULL,
	limits     jsonb       NOT NULL,
	user_name  text        NOT NULL,
	workdir    text        NOT NULL,
	env        jsonb       NOT NULL,
	metadata   jsonb       NOT NULL,
	size_bytes bigint      NOT NULL,
	node       text        NOT NULL,
	created_at timestamptz NOT NULL,
	UNIQUE (owner, name)
);
CREATE INDEX snapshots_by_owner ON snapshots (owner, created_at, id);
