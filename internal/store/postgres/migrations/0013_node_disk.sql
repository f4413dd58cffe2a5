-- The size and free space of each node's data dir file system, as of its
-- last heartbeat (bytes; 0 before a node reported them): GET /v1/nodes
-- shows them, and placement passes over a node short of disk.
ALTER TABLE nodes ADD COLUMN disk_bytes bigint NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN disk_free_bytes bigint NOT NULL DEFAULT 0;
