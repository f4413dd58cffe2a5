package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/edge"
	"github.com/kiln-sh/kiln/internal/errdefs"
)

// writeError answers with err unless the response has begun (a stream)
// or the client went away; the edge logs what the client did not see.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	e, status := s.edge.Problem(r.Context(), err)
	if (errors.Is(err, context.Canceled) && r.Context().Err() != nil) || edge.Started(w) {
		return
	}
	writeJSON(w, status, e)
}

// writeJSON encodes v as the response.
func writeJSON(w http.ResponseWriter, status int, v any) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if err := json.NewEncoder(w).Encode(v); err != nil {
		return fmt.Errorf("writing response: %w", err)
	}
	return nil
}

// invalid makes an invalid_argument error.
func invalid(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, errdefs.ErrInvalidArgument)...)
}

// notFound answers routes that do not exist, and methods a path does not
// have.
func (s *Server) notFound(w http.ResponseWriter, r *http.Request) error {
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, p := s.mux.Handler(probe); p != "/" && p != "" {
			allow = append(allow, m)
		}
	}
	if len(allow) == 0 {
		return fmt.Errorf("no route %s %s: %w", r.Method, r.URL.Path, errdefs.ErrNotFound)
	}
	w.Header().Set("Allow", strings.Join(allow, ", "))
	writeJSON(w, http.StatusMethodNotAllowed, &api.Error{
		Code:      api.CodeInvalidArgument,
		Message:   fmt.Sprintf("method %s not allowed here; allowed: %s", r.Method, strings.Join(allow, ", ")),
		RequestID: edge.RequestID(r.Context()),
	})
	return nil
}
