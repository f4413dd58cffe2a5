-- Persistent volumes (internal/volume): an ext4 image under
-- <data>/volumes/<id>/. Names are unique per owner.
CREATE TABLE volumes (
	id         TEXT    NOT NULL PRIMARY KEY,
	name       TEXT    NOT NULL,
	owner      TEXT    NOT NULL,
	size_bytes INTEGER NOT NULL,
	node       TEXT    NOT NULL,
	created_at INTEGER NOT NULL,
	UNIQUE (owner, name)
) STRICT;
CREATE INDEX volumes_by_owner ON volumes (owner, created_at, id);

-- Which sandboxes mount which volumes: a volume that a sandbox which has
-- not ended mounts cannot be deleted. The rows go with either record.
CREATE TABLE volume_mounts (
	sandbox_id TEXT NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
	volume_id  TEXT NOT NULL REFERENCES volumes (id) ON DELETE CASCADE,
	PRIMARY KEY (volume_id, sandbox_id)
) STRICT, WITHOUT ROWID;
CREATE INDEX volume_mounts_by_sandbox ON volume_mounts (sandbox_id);

-- A sandbox's volume mounts ([{volume, path, read_only}], JSON), so that a
-- restarted server still knows them (to show them, to refuse a pause).
ALTER TABLE sandboxes ADD COLUMN volumes TEXT NOT NULL DEFAULT '[]';
