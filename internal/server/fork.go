package server

import (
	"fmt"
	"net/http"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// forkSandbox forks a running runsc sandbox into new ones (see
// sandbox.Images.Fork); the forks belong to the caller and count
// against its quota.
func (s *Server) forkSandbox(w http.ResponseWriter, r *http.Request) error {
	var req api.ForkRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	if req.Count < 1 || req.Count > sandbox.MaxForks {
		return invalid("count %d: want 1-%d forks", req.Count, sandbox.MaxForks)
	}
	sb, err := s.lookup(r)
	if err != nil {
		return err
	}
	start := time.Now()
	sbs, err := s.im.Fork(r.Context(), sb.ID, req.Count, s.quota(caller(r)))
	s.metrics.ObserveOp("fork", time.Since(start), errCode(err))
	if err != nil {
		return fmt.Errorf("forking sandbox: %w", err)
	}
	out := api.ForkResponse{Sandboxes: make([]api.Sandbox, len(sbs))}
	for i, f := range sbs {
		out.Sandboxes[i] = toAPI(f)
	}
	return writeJSON(w, http.StatusCreated, out)
}
