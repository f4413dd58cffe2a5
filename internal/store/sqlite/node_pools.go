package sqlite

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// SetNodePools records node's ready pooled sandboxes, now.
func (s *Store) SetNodePools(ctx context.Context, node string, ready map[string]int) error {
	res, err := s.w.ExecContext(ctx, `UPDATE nodes SET pools = ?, pools_at = ? WHERE name = ?`,
		poolsJSON(ready), micros(time.Now()), node)
	if err != nil {
		return fmt.Errorf("writing node %s pools: %w", node, err)
	}
	if n, err := res.RowsAffected(); err == nil && n == 0 {
		return fmt.Errorf("node %s: %w", node, errdefs.ErrNotFound)
	}
	return nil
}

// poolsJSON encodes ready counts as both stores keep them ("{}" for
// none).
func poolsJSON(ready map[string]int) string {
	if ready == nil {
		ready = map[string]int{}
	}
	b, _ := json.Marshal(ready) // a map[string]int always encodes
	return string(b)
}
