package sandbox

import (
	"fmt"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// State is where a sandbox is in its lifecycle:
//
//	creating → running ⇄ paused → stopping → stopped
//	    └──────────┴────────┴──────────→ failed
type State string

const (
	StateCreating State = "creating"
	StateRunning  State = "running"
	StatePaused   State = "paused"
	StateStopping State = "stopping"
	StateStopped  State = "stopped"
	StateFailed   State = "failed"
)

var transitions = map[State][]State{
	StateCreating: {StateRunning, StateStopping, StateFailed},
	StateRunning:  {StatePaused, StateStopping, StateFailed},
	StatePaused:   {StateRunning, StateStopping, StateFailed},
	StateStopping: {StateStopped, StateFailed},
}

// CanTransition reports whether from → to is legal.
func CanTransition(from, to State) bool {
	for _, s := range transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

// Terminal reports whether no transition leaves s.
func (s State) Terminal() bool { return s == StateStopped || s == StateFailed }

func checkTransition(from, to State) error {
	if !CanTransition(from, to) {
		return fmt.Errorf("sandbox is %s, cannot become %s: %w", from, to, errdefs.ErrFailedPrecondition)
	}
	return nil
}
