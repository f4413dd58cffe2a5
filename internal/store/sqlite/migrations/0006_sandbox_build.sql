-- Sandboxes pin the build of a custom template they started from, so
-- that a fork, a snapshot's restore or a resume uses that build whatever
-- the template's name points at now (empty: a built-in template).
ALTER TABLE sandboxes ADD COLUMN build TEXT NOT NULL DEFAULT '';
ALTER TABLE snapshots ADD COLUMN build TEXT NOT NULL DEFAULT '';
