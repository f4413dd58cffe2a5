-- Custom templates (internal/template.Store): builds and the tags that
-- point at them. A build's files live under the data dir of its node.
-- finished_at is NULL while the build has not ended. Tags are unique per
-- (owner, name, tag); owner is '' for the built-ins. Names sort bytewise
-- (COLLATE "C"), as in SQLite.
CREATE TABLE template_builds (
	id          text COLLATE "C" NOT NULL PRIMARY KEY,
	template    text COLLATE "C" NOT NULL,
	owner       text COLLATE "C" NOT NULL,
	status      text        NOT NULL,
	spec        jsonb       NOT NULL,
	reason      text        NOT NULL,
	step        integer     NOT NULL,
	layers      jsonb       NOT NULL,
	config      jsonb       NOT NULL,
	node        text        NOT NULL,
	created_at  timestamptz NOT NULL,
	finished_at timestamptz
);
-- ListBuilds: by owner and name, by name alone, or all, newest first.
CREATE INDEX template_builds_by_owner ON template_builds (owner, template, created_at, id);
CREATE INDEX template_builds_by_template ON template_builds (template, created_at, id);
CREATE INDEX template_builds_by_created ON template_builds (created_at, id);
-- BuildsIn: the few builds still waiting or building at start-up.
CREATE INDEX template_builds_by_status ON template_builds (status);

CREATE TABLE template_tags (
	owner      text COLLATE "C" NOT NULL,
	name       text COLLATE "C" NOT NULL,
	tag        text COLLATE "C" NOT NULL,
	build_id   text        NOT NULL,
	public     boolean     NOT NULL,
	updated_at timestamptz NOT NULL,
	PRIMARY KEY (owner, name, tag)
);
-- ListTags and PublicTags by name across owners.
CREATE INDEX template_tags_by_name ON template_tags (name, owner, tag);
