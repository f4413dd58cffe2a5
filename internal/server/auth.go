package server

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/kiln-sh/kiln/internal/apikey"
	"github.com/kiln-sh/kiln/internal/edge"
	"github.com/kiln-sh/kiln/internal/errdefs"
)

// authenticate resolves the request's API key (the edge records it),
// unless the route is public.
func (s *Server) authenticate(r *http.Request, f routeFlags) error {
	if f&public != 0 {
		return nil
	}
	role := edge.AnyKey
	if f&adminOnly != 0 {
		role = edge.AdminKey
	}
	_, err := s.edge.Authenticate(r, role)
	return err
}

// caller is the authenticated key of a request.
func caller(r *http.Request) apikey.Key { return edge.Key(r.Context()) }

// keyCache remembers key lookups for a short TTL (it is the edge's Keys), so that a busy client
// costs one store query a second rather than one per request. Revocations
// through this server drop the entry at once; those on other nodes bite
// within the TTL.
type keyCache struct {
	store apikey.Store
	ttl   time.Duration

	mu      sync.Mutex
	entries map[string]cachedKey // by hash
}

type cachedKey struct {
	key     apikey.Key
	expires time.Time
}

// maxCachedKeys bounds the cache; on overflow it starts afresh.
const maxCachedKeys = 10000

func newKeyCache(st apikey.Store, ttl time.Duration) *keyCache {
	return &keyCache{store: st, ttl: ttl, entries: map[string]cachedKey{}}
}

func (c *keyCache) KeyByHash(ctx context.Context, hash []byte) (apikey.Key, error) {
	now := time.Now()
	c.mu.Lock()
	e, ok := c.entries[string(hash)]
	c.mu.Unlock()
	if ok && now.Before(e.expires) {
		return e.key, nil
	}
	if c.store == nil {
		return apikey.Key{}, fmt.Errorf("no key store: %w", errdefs.ErrNotFound)
	}
	k, err := c.store.KeyByHash(ctx, hash)
	if err != nil || c.ttl < 0 {
		return k, err
	}
	c.mu.Lock()
	if len(c.entries) >= maxCachedKeys {
		clear(c.entries)
	}
	c.entries[string(hash)] = cachedKey{key: k, expires: now.Add(c.ttl)}
	c.mu.Unlock()
	return k, nil
}

// forget drops a key from the cache (it was revoked).
func (c *keyCache) forget(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for h, e := range c.entries {
		if e.key.ID == id {
			delete(c.entries, h)
		}
	}
}
