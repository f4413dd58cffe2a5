package sandbox

import (
	"context"
	"fmt"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// Use returns a sandbox to work in, for every front end's data-plane call:
// its record and its agent. A sandbox that owner does not own is
// ErrNotFound (another tenant learns nothing of it). A sandbox paused at
// its timeout with auto-resume is resumed first (concurrent callers share
// one resume). A sandbox that is not running is ErrFailedPrecondition,
// with its state and reason.
func (m *Manager) Use(ctx context.Context, id ID, owner string) (Sandbox, *Agent, error) {
	return m.use(ctx, id, func(sb Sandbox) bool { return sb.Owner == owner })
}

// UseGranted is Use for a caller that holds a credential of the sandbox
// itself (its access or traffic token), checked by the front end: any
// owner's sandbox.
func (m *Manager) UseGranted(ctx context.Context, id ID) (Sandbox, *Agent, error) {
	return m.use(ctx, id, func(Sandbox) bool { return true })
}

func (m *Manager) use(ctx context.Context, id ID, visible func(Sandbox) bool) (Sandbox, *Agent, error) {
	sb, err := m.Get(ctx, id)
	if err == nil && !visible(sb) {
		err = errdefs.ErrNotFound
	}
	if err != nil {
		return Sandbox{}, nil, fmt.Errorf("sandbox %s: %w", id, err)
	}
	if sb.State == StatePaused && sb.AutoResume {
		if sb, err = m.Wake(ctx, id); err != nil {
			return Sandbox{}, nil, fmt.Errorf("resuming auto-paused sandbox: %w", err)
		}
	}
	if err := sb.Running(); err != nil {
		return sb, nil, err
	}
	a, err := m.Agent(id)
	if err != nil {
		return sb, nil, err
	}
	return sb, a, nil
}

// Running returns nil for a running sandbox, else ErrFailedPrecondition
// saying what state it is in and why.
func (sb Sandbox) Running() error {
	if sb.State == StateRunning {
		return nil
	}
	msg := fmt.Sprintf("sandbox %s is %s", sb.ID, sb.State)
	if sb.Reason != "" {
		msg += " (" + sb.Reason + ")"
	}
	return fmt.Errorf("%s: %w", msg, errdefs.ErrFailedPrecondition)
}
