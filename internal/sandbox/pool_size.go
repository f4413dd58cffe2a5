package sandbox

import (
	"context"
	"time"
)

// SetPoolSizes makes sizes the pools' targets (a template left out, or
// with 0, has none): the pools start if they had not; a pool above its
// target (it shrank, or a fill finished after it did) gives its extra
// ready sandboxes up, which are destroyed; one below is refilled. A
// cluster node calls it as the number of live nodes changes
// (cluster.PoolSizes); it must not race StartPools.
func (im *Images) SetPoolSizes(sizes map[string]int) {
	p := im.pool()
	if p == nil {
		im.StartPools(sizes)
		return
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	for name := range p.targets {
		if sizes[name] <= 0 {
			delete(p.targets, name)
		}
	}
	for name, n := range sizes {
		if n > 0 {
			p.targets[name] = n
		}
	}
	var extra []*pooled
	now := time.Now()
	for name, q := range p.ready {
		if over := len(q) - p.target(name, now); over > 0 {
			// The newest go: the oldest are claimed first.
			extra = append(extra, q[len(q)-over:]...)
			p.ready[name] = append([]*pooled(nil), q[:len(q)-over]...)
		}
	}
	p.mu.Unlock()
	p.kick()
	if len(extra) == 0 {
		return
	}
	im.log.Info("pool sizes lowered; destroying the extra pooled sandboxes", "sizes", sizes, "destroyed", len(extra))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, e := range extra {
		im.core.discard(ctx, e.b)
	}
}
