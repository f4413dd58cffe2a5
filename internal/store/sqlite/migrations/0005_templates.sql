-- Custom templates (internal/template.Store): builds and the tags that
-- point at them. A build's spec, config and layers are JSON text; its
-- files live under the data dir of its node. finished_at is NULL while
-- the build has not ended. Tags are unique per (owner, name, tag); owner
-- is '' for the built-ins.
CREATE TABLE template_builds (
	id          TEXT    NOT NULL PRIMARY KEY,
	template    TEXT    NOT NULL,
	owner       TEXT    NOT NULL,
	status      TEXT    NOT NULL,
	spec        TEXT    NOT NULL,
	reason      TEXT    NOT NULL,
	step        INTEGER NOT NULL,
	layers      TEXT    NOT NULL,
	config      TEXT    NOT NULL,
	node        TEXT    NOT NULL,
	created_at  INTEGER NOT NULL,
	finished_at INTEGER
) STRICT;
-- ListBuilds: by owner and name, by name alone, or all, newest first.
CREATE INDEX template_builds_by_owner ON template_builds (owner, template, created_at, id);
CREATE INDEX template_builds_by_template ON template_builds (template, created_at, id);
CREATE INDEX template_builds_by_created ON template_builds (created_at, id);
-- BuildsIn: the few builds still waiting or building at start-up.
CREATE INDEX template_builds_by_status ON template_builds (status);

CREATE TABLE template_tags (
	owner      TEXT    NOT NULL,
	name       TEXT    NOT NULL,
	tag        TEXT    NOT NULL,
	build_id   TEXT    NOT NULL,
	public     INTEGER NOT NULL,
	updated_at INTEGER NOT NULL,
	PRIMARY KEY (owner, name, tag)
) STRICT, WITHOUT ROWID;
-- ListTags and PublicTags by name across owners.
CREATE INDEX template_tags_by_name ON template_tags (name, owner, tag);
