package e2b

import (
	"context"
	"errors"
	"sync"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// setAutoPause maps E2B's autoPause (lifecycle.onTimeout "pause") onto
// the sandbox: it is paused, not killed, when its timeout expires, and
// connect resumes it.
func setAutoPause(o *sandbox.CreateOptions, on bool) { o.AutoPause = on }

// onTimeout says what happens to sb at its timeout, as E2B's lifecycle
// names it.
func onTimeout(sb sandbox.Sandbox) string {
	if sb.AutoPause {
		return "pause"
	}
	return "kill"
}

// autoResumes remembers the sandboxes created with E2B's autoResume: a
// data-plane request resumes them when they are paused (without it a
// paused sandbox's data plane answers 502, as on E2B). Sandbox records
// have no field for it, so it is this server's memory: after a restart
// of kiln serve such sandboxes resume only through connect.
type autoResumes struct {
	mu  sync.Mutex
	ids map[sandbox.ID]bool
}

// maxAutoResumes bounds the set; past it, sandboxes that are gone are
// forgotten.
const maxAutoResumes = 10000

func (a *autoResumes) add(m *sandbox.Manager, id sandbox.ID) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ids == nil {
		a.ids = map[sandbox.ID]bool{}
	}
	if len(a.ids) >= maxAutoResumes {
		live := map[sandbox.ID]bool{}
		for _, sb := range m.Live() {
			live[sb.ID] = true
		}
		for id := range a.ids {
			if !live[id] {
				delete(a.ids, id)
			}
		}
	}
	a.ids[id] = true
}

func (a *autoResumes) has(id sandbox.ID) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.ids[id]
}

func (a *autoResumes) remove(id sandbox.ID) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.ids, id)
}

// wake resumes paused sandbox sb for a data-plane request, if it was
// created with autoResume; concurrent requests share one resume.
func (h *Handler) wake(ctx context.Context, sb sandbox.Sandbox) (sandbox.Sandbox, error) {
	if sb.State != sandbox.StatePaused || !h.autoResume.has(sb.ID) {
		return sb, nil
	}
	if sb.AutoPause {
		return h.m.Wake(ctx, sb.ID)
	}
	woken, err := h.m.Resume(ctx, sb.ID)
	if errors.Is(err, errdefs.ErrFailedPrecondition) { // another request resumed it
		return h.m.Get(ctx, sb.ID)
	}
	return woken, err
}
