-- ids sort bytewise (COLLATE "C") so the listing order is the same as
-- SQLite's whatever the database's locale. NULL times mean "never".
CREATE TABLE sandboxes (
	id         text COLLATE "C" NOT NULL PRIMARY KEY,
	template   text        NOT NULL,
	runtime    text        NOT NULL,
	state      text        NOT NULL,
	reason     text        NOT NULL,
	limits     jsonb       NOT NULL,
	user_name  text        NOT NULL,
	workdir    text        NOT NULL,
	env        jsonb       NOT NULL,
	metadata   jsonb       NOT NULL,
	owner      text        NOT NULL,
	node       text        NOT NULL,
	created_at timestamptz NOT NULL,
	expires_at timestamptz
);
CREATE INDEX sandboxes_by_created ON sandboxes (created_at, id);
CREATE INDEX sandboxes_by_owner ON sandboxes (owner, created_at, id);
CREATE INDEX sandboxes_by_node ON sandboxes (node, created_at, id);
CREATE INDEX sandboxes_by_metadata ON sandboxes USING gin (metadata jsonb_path_ops);

CREATE TABLE api_keys (
	id               text COLLATE "C" NOT NULL PRIMARY KEY,
	name             text        NOT NULL,
	prefix           text        NOT NULL,
	hash             bytea       NOT NULL UNIQUE,
	admin            boolean     NOT NULL,
	created_at       timestamptz NOT NULL,
	revoked_at       timestamptz,
	max_sandboxes    bigint      NOT NULL,
	max_memory_bytes bigint      NOT NULL
);
CREATE INDEX api_keys_by_created ON api_keys (created_at, id);
