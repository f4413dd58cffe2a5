-- Retention of ended sandboxes: ended_at is when a sandbox became stopped
-- or failed (NULL while it lives); ended records keep no env or metadata
-- and are deleted some time after they ended. Records that ended before
-- this migration count as ended when they were created, and lose their
-- env and metadata now.
ALTER TABLE sandboxes ADD COLUMN ended_at timestamptz;
UPDATE sandboxes SET ended_at = created_at, env = '{}', metadata = '{}'
	WHERE state IN ('stopped', 'failed');
CREATE INDEX sandboxes_by_ended ON sandboxes (ended_at) WHERE ended_at IS NOT NULL;
