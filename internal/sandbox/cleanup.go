package sandbox

import (
	"context"
	"errors"
	"time"
)

// unwindTimeout bounds the undo steps of a failed bring-up: they run on a
// context detached from the caller's, which may be what failed. An undo
// step cut short leaks what it undoes (a runsc sandbox, a busy layer
// mount), so the bound is generous: a `runsc delete` outlasted 30 s at a
// load of 110 (CI 17, TestWarmFallsBackToCold).
const unwindTimeout = 2 * time.Minute

// cleanup is the undo stack of something being made in steps (a sandbox
// being brought up): each step that makes something pushes how to remove
// it; on success the maker releases the stack, on failure unwinds it, in
// reverse. The zero value is ready to use. Not safe for concurrent use.
type cleanup struct {
	steps []func(context.Context) error
}

// add pushes an undo step.
func (c *cleanup) add(undo func(context.Context) error) { c.steps = append(c.steps, undo) }

// take moves the steps of inner onto c (a sub-step that succeeded hands
// its undo steps to its caller) and empties inner.
func (c *cleanup) take(inner *cleanup) {
	c.steps = append(c.steps, inner.steps...)
	inner.steps = nil
}

// release forgets the steps: what they would undo is kept.
func (c *cleanup) release() { c.steps = nil }

// unwind runs the steps in reverse order on a context detached from ctx
// (bounded by unwindTimeout), runs every step even when some fail, and
// returns their errors joined. The stack is empty afterwards.
func (c *cleanup) unwind(ctx context.Context) error {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unwindTimeout)
	defer cancel()
	var errs []error
	for i := len(c.steps) - 1; i >= 0; i-- {
		if err := c.steps[i](uctx); err != nil {
			errs = append(errs, err)
		}
	}
	c.steps = nil
	return errors.Join(errs...)
}
