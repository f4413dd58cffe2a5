package e2b

import (
	"context"

	"github.com/kiln-sh/kiln/internal/sandbox"
)

// onTimeout says what happens to sb at its timeout, as E2B's lifecycle
// names it.
func onTimeout(sb sandbox.Sandbox) string {
	if sb.AutoPause {
		return "pause"
	}
	return "kill"
}

// wake resumes paused sandbox sb for a data-plane request, if it was
// created with autoResume (without it a paused sandbox's data plane
// answers 502, as on E2B); concurrent requests share one resume. The
// check here spares running sandboxes Wake's lock.
func (h *Handler) wake(ctx context.Context, sb sandbox.Sandbox) (sandbox.Sandbox, error) {
	if sb.State != sandbox.StatePaused || !sb.AutoResume {
		return sb, nil
	}
	return h.m.Wake(ctx, sb.ID)
}
