package cluster

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// cacheTTL is how old a Directory's listing may be, missTTL how old it
// may be for a node it lacks (one that just registered), and readTimeout
// how long reading one may take.
const (
	cacheTTL    = time.Second
	missTTL     = 100 * time.Millisecond
	readTimeout = 10 * time.Second
)

// cached is one listing of the nodes and when it was read. Concurrent
// callers of an expired listing wait for one read.
type cached struct {
	mu    sync.Mutex
	at    time.Time
	nodes []Node
	// failed is when a read last failed (Unix nanoseconds; 0: never).
	failed atomic.Int64
	// heard is when the catalog last took a heartbeat of any serving
	// node, on this host's clock (Unix nanoseconds; 0: none known).
	heard atomic.Int64
}

// get returns the listing if it is younger than maxAge, else reads a new
// one.
func (c *cached) get(ctx context.Context, st Store, maxAge time.Duration) ([]Node, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.at) < maxAge {
		return c.nodes, nil
	}
	// Bounded: every caller waits on this one read.
	rctx, cancel := context.WithTimeout(ctx, readTimeout)
	ns, err := st.Nodes(rctx)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			c.failed.Store(time.Now().UnixNano())
		}
		return nil, fmt.Errorf("reading the node registry: %w", err)
	}
	c.nodes, c.at = ns, time.Now()
	var last time.Time
	for _, n := range ns {
		if at := n.ReadAt.Add(-n.Quiet); n.Serving() && at.After(last) {
			last = at
		}
	}
	if !last.IsZero() {
		c.heard.Store(last.UnixNano())
	}
	return ns, nil
}

// heardAt is when the catalog last took a heartbeat of a serving node,
// as of the last listing (the zero time if none is known).
func (c *cached) heardAt() time.Time {
	if ns := c.heard.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// failedAt is when a read last failed (the zero time if none did).
func (c *cached) failedAt() time.Time {
	if ns := c.failed.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}
