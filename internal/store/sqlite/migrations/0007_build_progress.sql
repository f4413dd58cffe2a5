-- A build record keeps when it started (it left waiting) and how many of
-- its steps it got through and found in the layer cache, set when it
-- ends, so that reading a build does not read its log. Builds recorded
-- before started when they were created (no build waited then); a ready
-- one got through every step; how many of an old build's steps were
-- cached is not known (0).
ALTER TABLE template_builds ADD COLUMN started_at INTEGER;
ALTER TABLE template_builds ADD COLUMN steps_done INTEGER NOT NULL DEFAULT 0;
ALTER TABLE template_builds ADD COLUMN cached_steps INTEGER NOT NULL DEFAULT 0;
UPDATE template_builds SET started_at = created_at WHERE status <> 'waiting';
UPDATE template_builds SET steps_done = COALESCE(json_array_length(spec, '$.steps'), 0) WHERE status = 'ready';
