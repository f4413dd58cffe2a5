package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/kiln-sh/kiln/internal/apikey"
	"github.com/kiln-sh/kiln/internal/errdefs"
)

// authenticate resolves the request's API key into its reqInfo, unless the
// route is public.
func (s *Server) authenticate(r *http.Request, f routeFlags) error {
	if f&public != 0 {
		return nil
	}
	secret, err := keySecret(r)
	if err != nil {
		return err
	}
	if !apikey.WellFormed(secret) {
		return fmt.Errorf("malformed API key: want e2b_ and 40 hex digits: %w", errdefs.ErrUnauthenticated)
	}
	k, err := s.keys.lookup(r.Context(), apikey.Hash(secret))
	if errors.Is(err, errdefs.ErrNotFound) || (err == nil && k.Revoked()) {
		return fmt.Errorf("unknown or revoked API key: %w", errdefs.ErrUnauthenticated)
	}
	if err != nil {
		return fmt.Errorf("looking up API key: %w", err)
	}
	if f&adminOnly != 0 && !k.Admin {
		return fmt.Errorf("this route needs an admin key: %w", errdefs.ErrPermissionDenied)
	}
	info(r.Context()).key = &k
	return nil
}

// keySecret returns the API key a request carries.
func keySecret(r *http.Request) (string, error) {
	secret := r.Header.Get("X-API-Key")
	if h := r.Header.Get("Authorization"); h != "" {
		scheme, token, ok := strings.Cut(h, " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") {
			return "", fmt.Errorf("authorization header: want Bearer <key>: %w", errdefs.ErrUnauthenticated)
		}
		secret = strings.TrimSpace(token)
	}
	if secret == "" {
		return "", fmt.Errorf("missing API key: send Authorization: Bearer <key> or X-API-Key: <key>: %w", errdefs.ErrUnauthenticated)
	}
	return secret, nil
}

// caller is the authenticated key of a request.
func caller(r *http.Request) apikey.Key {
	if k := info(r.Context()).key; k != nil {
		return *k
	}
	return apikey.Key{}
}

// keyCache remembers key lookups for a short TTL, so that a busy client
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

func (c *keyCache) lookup(ctx context.Context, hash []byte) (apikey.Key, error) {
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
