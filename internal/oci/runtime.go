// Package oci drives OCI runtime binaries (runsc, runc) for one bundle per
// sandbox, builds the bundle's spec and reads the sandbox's cgroup stats.
package oci

import (
	"context"
	"os"
	"syscall"
)

// Runtime creates and controls containers from bundles.
type Runtime interface {
	Name() string
	Create(ctx context.Context, id string, b *Bundle, io IO) error
	Start(ctx context.Context, id string) error
	State(ctx context.Context, id string) (State, error)
	Kill(ctx context.Context, id string, sig syscall.Signal) error
	Delete(ctx context.Context, id string, force bool) error
}

// Pauser is a Runtime that can freeze and thaw a container.
type Pauser interface {
	Pause(ctx context.Context, id string) error
	Resume(ctx context.Context, id string) error
}

// IO is the container process's stdio, handed to the create command as its
// own stdio. Nil fields get /dev/null, except Stderr, which then goes to the
// bundle's create.log with the runtime's own messages. Never pass a pipe
// whose reader waits for EOF: the container holds its end for its lifetime.
type IO struct {
	Stdin, Stdout, Stderr *os.File
}

// Container statuses reported by State.
const (
	StatusCreated = "created"
	StatusRunning = "running"
	StatusPaused  = "paused"
	StatusStopped = "stopped"
)

// State is a container's state as the runtime reports it.
type State struct {
	ID     string
	Status string
	Pid    int
	Bundle string
	// HelperPids are other host processes the runtime runs for the
	// container (runsc's gofer), for callers that must reap them.
	HelperPids []int
}
