package e2b

import (
	"context"

	"github.com/kiln-sh/kiln/internal/sandbox"
)

// setLifecycle maps E2B's autoPause (lifecycle.onTimeout "pause") and
// autoResume onto the sandbox's record, where they survive a restart of
// kiln serve: it is paused, not killed, when its timeout expires, and
// connect resumes it; with autoResume any data-plane request does too
// (without it a paused sandbox's data plane answers 502, as on E2B).
func setLifecycle(o *sandbox.CreateOptions, autoPause, autoResume bool) {
	o.AutoPause, o.AutoResume = autoPause, autoResume
}

// onTimeout says what happens to sb at its timeout, as E2B's lifecycle
// names it.
func onTimeout(sb sandbox.Sandbox) string {
	if sb.AutoPause {
		return "pause"
	}
	return "kill"
}

// wake resumes paused sandbox sb for a data-plane request, if it was
// created with autoResume; concurrent requests share one resume.
func (h *Handler) wake(ctx context.Context, sb sandbox.Sandbox) (sandbox.Sandbox, error) {
	if sb.State != sandbox.StatePaused || !sb.AutoResume {
		return sb, nil
	}
	return h.m.Wake(ctx, sb.ID)
}
