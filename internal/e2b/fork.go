package e2b

import (
	"fmt"
	"net/http"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// defaultForkTimeout is E2B's lifetime of a fork (seconds).
const defaultForkTimeout = 15

type forkRequest struct {
	Count   *int   `json:"count"`
	Timeout *int64 `json:"timeout"`
}

// forkResult is E2B's SandboxForkResult: one of Sandbox and Error.
type forkResult struct {
	Sandbox *sandboxJSON `json:"sandbox,omitempty"`
	Error   *errorBody   `json:"error,omitempty"`
}

// fork is POST /sandboxes/{id}/fork: count sandboxes that continue from
// the running sandbox's state (sandbox.Images.Fork: gVisor only), each
// living timeout seconds.
func (h *Handler) fork(w http.ResponseWriter, r *http.Request, c Caller) error {
	var req forkRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	count, timeout := 1, int64(defaultForkTimeout)
	if req.Count != nil {
		count = *req.Count
	}
	if req.Timeout != nil && *req.Timeout > 0 {
		timeout = *req.Timeout
	}
	sb, err := h.lookup(r, c)
	if err != nil {
		return err
	}
	if sb.State != sandbox.StateRunning {
		return fmt.Errorf("sandbox %s is %s; only a running sandbox can be forked: %w", sb.ID, sb.State, errdefs.ErrFailedPrecondition)
	}
	forks, err := h.im.Fork(r.Context(), sb.ID, count, c.Quota)
	if err != nil {
		return fmt.Errorf("forking sandbox: %w", err)
	}
	out := make([]forkResult, len(forks))
	for i, f := range forks {
		if f, err = h.m.SetTimeout(r.Context(), f.ID, seconds(timeout)); err != nil {
			status, msg := h.problem(r, err)
			out[i].Error = &errorBody{Code: status, Message: msg}
			continue
		}
		j := h.sandboxJSON(f, "")
		out[i].Sandbox = &j
	}
	writeJSON(w, http.StatusCreated, out)
	return nil
}
