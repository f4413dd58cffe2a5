-- Ready pooled sandboxes per template of each node, as it last reported
-- them (template → count), and when (the database's clock; NULL before
-- its first report): fronts prefer a node with a ready one of the
-- template a create asks for (docs/pools.md, "Pools in a cluster").
ALTER TABLE nodes ADD COLUMN pools jsonb NOT NULL DEFAULT '{}';
ALTER TABLE nodes ADD COLUMN pools_at timestamptz;
