package edge

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/kiln-sh/kiln/internal/apikey"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// Keys is the auth seam: where the edge looks an API key up by its
// secret's hash (errdefs.ErrNotFound if none). apikey.Store satisfies it;
// kiln serve puts a short-lived cache in front (internal/server).
type Keys interface {
	KeyByHash(ctx context.Context, hash []byte) (apikey.Key, error)
}

// Caller is who a request authenticated as.
type Caller struct {
	Key   apikey.Key
	Quota sandbox.Quota // what the key may hold at once
}

// Role is what a route asks of a key.
type Role int

const (
	AnyKey   Role = iota // any valid, unrevoked key
	AdminKey             // an admin key
)

// Authenticate resolves the API key r carries (Authorization: Bearer
// <key>, or X-API-Key) into its caller and records it for the request
// log; a key that is malformed, unknown or revoked is unauthenticated,
// one below role is permission denied.
func (e *Edge) Authenticate(r *http.Request, role Role) (Caller, error) {
	e = e.or()
	if e.keys == nil {
		return Caller{}, fmt.Errorf("no API keys configured: %w", errdefs.ErrUnauthenticated)
	}
	secret, err := Secret(r)
	if err != nil {
		return Caller{}, err
	}
	if !apikey.WellFormed(secret) {
		return Caller{}, fmt.Errorf("malformed API key: want e2b_ and 40 hex digits: %w", errdefs.ErrUnauthenticated)
	}
	k, err := e.keys.KeyByHash(r.Context(), apikey.Hash(secret))
	if errors.Is(err, errdefs.ErrNotFound) || (err == nil && k.Revoked()) {
		return Caller{}, fmt.Errorf("unknown or revoked API key: %w", errdefs.ErrUnauthenticated)
	}
	if err != nil {
		return Caller{}, fmt.Errorf("looking up API key: %w", err)
	}
	if role == AdminKey && !k.Admin {
		return Caller{}, fmt.Errorf("this route needs an admin key: %w", errdefs.ErrPermissionDenied)
	}
	if ri := infoOf(r.Context()); ri != nil {
		ri.key = &k
	}
	return Caller{Key: k, Quota: e.Quota(k)}, nil
}

// Secret returns the API key a request carries (Authorization: Bearer, or
// X-API-Key).
func Secret(r *http.Request) (string, error) {
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

// Quota is what key k may hold at once: its own limits, else the
// defaults.
func (e *Edge) Quota(k apikey.Key) sandbox.Quota {
	e = e.or()
	q := sandbox.Quota{MaxSandboxes: k.MaxSandboxes, MaxMemoryBytes: k.MaxMemoryBytes}
	if q.MaxSandboxes == 0 {
		q.MaxSandboxes = e.quota.MaxSandboxes
	}
	if q.MaxMemoryBytes == 0 {
		q.MaxMemoryBytes = e.quota.MaxMemoryBytes
	}
	return q
}
