-- Templates across a cluster's nodes (docs/cluster.md): a build pushed to
-- the cluster registry records its image, which nodes without the
-- build's files pull; nodes report the builds whose files they hold.
ALTER TABLE template_builds ADD COLUMN image TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN builds TEXT NOT NULL DEFAULT '[]';
