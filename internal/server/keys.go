package server

import (
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"unicode"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/apikey"
	"github.com/kiln-sh/kiln/internal/edge"
	"github.com/kiln-sh/kiln/internal/errdefs"
)

// keyIDRE is the shape of apikey.New's ids.
var keyIDRE = regexp.MustCompile(`^key_[0-9a-f]{1,64}$`)

func (s *Server) listKeys(w http.ResponseWriter, r *http.Request) error {
	keys, err := s.keys.store.ListKeys(r.Context())
	if err != nil {
		return fmt.Errorf("listing keys: %w", err)
	}
	out := make([]api.APIKey, 0, len(keys))
	for _, k := range keys {
		out = append(out, keyToAPI(k))
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) createKey(w http.ResponseWriter, r *http.Request) error {
	var req api.CreateKeyRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	if err := checkKeyRequest(req); err != nil {
		return err
	}
	k, secret := apikey.New(req.Name, req.Admin)
	k.MaxSandboxes, k.MaxMemoryBytes = req.MaxSandboxes, req.MaxMemoryBytes
	if err := s.keys.store.CreateKey(r.Context(), k); err != nil {
		return fmt.Errorf("creating key: %w", err)
	}
	s.log.Info("API key created", "request_id", edge.RequestID(r.Context()), "key_id", k.ID, "by", caller(r).ID, "admin", k.Admin)
	out := keyToAPI(k)
	out.Secret = secret
	return writeJSON(w, http.StatusCreated, out)
}

func checkKeyRequest(req api.CreateKeyRequest) error {
	switch {
	case strings.TrimSpace(req.Name) == "" || len(req.Name) > 128:
		return invalid("name: want 1-128 bytes")
	case strings.IndexFunc(req.Name, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0:
		return invalid("name: printable characters only")
	case req.MaxSandboxes < 0 || req.MaxMemoryBytes < 0:
		return invalid("quotas must not be negative (0 takes the server's default)")
	}
	return nil
}

// revokeKey revokes a key; the key making the request cannot revoke
// itself (that could lock out the last admin).
func (s *Server) revokeKey(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if !keyIDRE.MatchString(id) {
		return invalid("key id %q: want key_ and hex digits", errdefs.ClipN(id, 40))
	}
	if id == caller(r).ID {
		return fmt.Errorf("a key cannot revoke itself: %w", errdefs.ErrFailedPrecondition)
	}
	if err := s.keys.store.RevokeKey(r.Context(), id, now()); err != nil {
		return fmt.Errorf("revoking key %s: %w", id, err)
	}
	s.keys.forget(id)
	s.log.Info("API key revoked", "request_id", edge.RequestID(r.Context()), "key_id", id, "by", caller(r).ID)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func keyToAPI(k apikey.Key) api.APIKey {
	return api.APIKey{
		ID: k.ID, Name: k.Name, Prefix: k.Prefix, Admin: k.Admin,
		CreatedAt: k.CreatedAt, RevokedAt: k.RevokedAt,
		MaxSandboxes: k.MaxSandboxes, MaxMemoryBytes: k.MaxMemoryBytes,
	}
}
