-- Times are INTEGER microseconds since the Unix epoch, UTC; NULL means
-- "never" (expires_at, revoked_at). Maps are JSON text.
CREATE TABLE sandboxes (
	id         TEXT    NOT NULL PRIMARY KEY,
	template   TEXT    NOT NULL,
	runtime    TEXT    NOT NULL,
	state      TEXT    NOT NULL,
	reason     TEXT    NOT NULL,
	limits     TEXT    NOT NULL,
	user_name  TEXT    NOT NULL,
	workdir    TEXT    NOT NULL,
	env        TEXT    NOT NULL,
	metadata   TEXT    NOT NULL,
	owner      TEXT    NOT NULL,
	node       TEXT    NOT NULL,
	created_at INTEGER NOT NULL,
	expires_at INTEGER
) STRICT;
CREATE INDEX sandboxes_by_created ON sandboxes (created_at, id);
CREATE INDEX sandboxes_by_owner ON sandboxes (owner, created_at, id);
CREATE INDEX sandboxes_by_node ON sandboxes (node, created_at, id);

-- One row per metadata pair, so that filtering by metadata is an index
-- lookup rather than a JSON scan of every record.
CREATE TABLE sandbox_metadata (
	sandbox_id TEXT NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
	key        TEXT NOT NULL,
	value      TEXT NOT NULL,
	PRIMARY KEY (sandbox_id, key)
) STRICT, WITHOUT ROWID;
CREATE INDEX sandbox_metadata_by_pair ON sandbox_metadata (key, value);

CREATE TABLE api_keys (
	id               TEXT    NOT NULL PRIMARY KEY,
	name             TEXT    NOT NULL,
	prefix           TEXT    NOT NULL,
	hash             BLOB    NOT NULL UNIQUE,
	admin            INTEGER NOT NULL,
	created_at       INTEGER NOT NULL,
	revoked_at       INTEGER,
	max_sandboxes    INTEGER NOT NULL,
	max_memory_bytes INTEGER NOT NULL
) STRICT;
CREATE INDEX api_keys_by_created ON api_keys (created_at, id);
