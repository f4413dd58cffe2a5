// Package kernel runs code in persistent interpreter contexts inside the
// sandbox: Jupyter kernels spoken to over ZMQ (kernel/jupyter), REPLs the
// agent drives itself (kernel/repl), and one-shot compile-and-run for
// compiled languages (kernel/oneshot), all behind the Kernel seam.
package kernel

import (
	"context"

	"github.com/kiln-sh/kiln/api"
)

// Kernel is one interactive interpreter context.
type Kernel interface {
	Language() string
	// Execute runs code and calls emit for every event in order (stdout,
	// stderr, result, execution_error); it returns when the execution
	// ends, when ctx is done (then it interrupts the code, and the kernel
	// stays usable), or when emit fails (client gone). It returns the
	// execution count. env applies to this execution only. A hidden
	// execution (see WithHidden) is not counted: the count it returns
	// is the user's last.
	Execute(ctx context.Context, code string, env map[string]string, emit func(api.Event) error) (count int, err error)
	// Interrupt stops the running execution, keeping the kernel's state.
	Interrupt(ctx context.Context) error
	// Restart replaces the interpreter with a fresh one (state is lost).
	Restart(ctx context.Context) error
	Close() error
}

// Options start a kernel.
type Options struct {
	Cwd string
	Env []string // KEY=value: the sandbox's environment plus the context's
	// UID and GID the interpreter runs as.
	UID, GID uint32
}

// Factory starts a kernel for one language.
type Factory func(ctx context.Context, o Options) (Kernel, error)

type hiddenKey struct{}

// WithHidden marks the execution run with ctx as hidden: code the agent
// or the host runs for itself (a warm template's imports, a restored
// sandbox's environment update), which the user's execution count and
// history do not include, so that the user's first cell is number 1.
func WithHidden(ctx context.Context) context.Context {
	return context.WithValue(ctx, hiddenKey{}, true)
}

// IsHidden reports whether ctx marks a hidden execution.
func IsHidden(ctx context.Context) bool {
	h, _ := ctx.Value(hiddenKey{}).(bool)
	return h
}
