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
	// execution count. env applies to this execution only.
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
