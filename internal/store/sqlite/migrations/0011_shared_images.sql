-- Images in the cluster's shared snapshot dir (KILN_SNAPSHOT_DIR,
-- docs/snapshots.md): "<path>@sha256:<digest of its manifest>", or '' for
-- an image on its node only. A paused sandbox with one can be resumed on
-- another node, and is not failed when its node is lost; a snapshot with
-- one can be restored on any node.
ALTER TABLE sandboxes ADD COLUMN image TEXT NOT NULL DEFAULT '';
ALTER TABLE snapshots ADD COLUMN image TEXT NOT NULL DEFAULT '';
