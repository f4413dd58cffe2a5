-- Ready pooled sandboxes per template of each node, as it last reported
-- them (a JSON object, template → count), and when (microseconds since
-- the epoch; NULL before its first report): fronts prefer a node with a
-- ready one of the template a create asks for (docs/pools.md, "Pools in
-- a cluster").
ALTER TABLE nodes ADD COLUMN pools TEXT NOT NULL DEFAULT '{}';
ALTER TABLE nodes ADD COLUMN pools_at INTEGER;
