package postgres

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// SetNodePools records node's ready pooled sandboxes, at the database's
// now.
func (s *Store) SetNodePools(ctx context.Context, node string, ready map[string]int) error {
	if ready == nil {
		ready = map[string]int{}
	}
	b, _ := json.Marshal(ready) // a map[string]int always encodes
	tag, err := s.pool.Exec(ctx, `UPDATE nodes SET pools = $2::jsonb, pools_at = now() WHERE name = $1`, node, string(b))
	if err != nil {
		return fmt.Errorf("writing node %s pools: %w", node, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("node %s: %w", node, errdefs.ErrNotFound)
	}
	return nil
}
