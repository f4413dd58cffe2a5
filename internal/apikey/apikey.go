// Package apikey makes, hashes and checks API keys. Keys are shaped
// e2b_<40 lowercase hex> so that every version of E2B's SDKs (some of which
// check that shape client-side) accepts Kiln's keys unchanged. Only a
// SHA-256 of each secret is stored.
package apikey

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"time"
)

// Key is a stored API key.
type Key struct {
	ID        string
	Name      string
	Prefix    string // the secret's first 12 characters, for recognising it
	Hash      []byte // SHA-256 of the secret
	Admin     bool   // may manage keys and see every sandbox
	CreatedAt time.Time
	RevokedAt time.Time // zero while valid
	// Quotas; zero means the server's default.
	MaxSandboxes   int
	MaxMemoryBytes int64
}

// Revoked reports whether the key was revoked.
func (k Key) Revoked() bool { return !k.RevokedAt.IsZero() }

// Store persists keys. Implementations live in internal/store.
type Store interface {
	CreateKey(ctx context.Context, k Key) error
	// KeyByHash finds a key by its secret's hash; errdefs.ErrNotFound if
	// none.
	KeyByHash(ctx context.Context, hash []byte) (Key, error)
	// ListKeys returns all keys, revoked ones included, oldest first.
	ListKeys(ctx context.Context) ([]Key, error)
	// RevokeKey marks a key revoked; errdefs.ErrNotFound if unknown.
	RevokeKey(ctx context.Context, id string, at time.Time) error
}

var secretRE = regexp.MustCompile(`^e2b_[0-9a-f]{40}$`)

// New makes a key and returns it with its secret, which is shown once.
func New(name string, admin bool) (Key, string) {
	b := make([]byte, 20)
	_, _ = rand.Read(b)
	secret := "e2b_" + hex.EncodeToString(b)
	id := make([]byte, 6)
	_, _ = rand.Read(id)
	return Key{
		ID:        "key_" + hex.EncodeToString(id),
		Name:      name,
		Prefix:    secret[:12],
		Hash:      Hash(secret),
		Admin:     admin,
		CreatedAt: time.Now().UTC(),
	}, secret
}

// Hash returns the stored form of a secret.
func Hash(secret string) []byte {
	h := sha256.Sum256([]byte(secret))
	return h[:]
}

// WellFormed reports whether s has the shape of a Kiln key; malformed
// secrets are refused without a store lookup.
func WellFormed(s string) bool { return secretRE.MatchString(s) }
