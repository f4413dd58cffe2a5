package api

import "time"

// Sandbox is a sandbox as the REST API shows it.
type Sandbox struct {
	ID       string            `json:"id"`
	Template string            `json:"template"`
	Runtime  string            `json:"runtime"`
	State    string            `json:"state"` // creating, running, paused, stopping, stopped, failed
	Reason   string            `json:"reason,omitempty"`
	Limits   Limits            `json:"limits"`
	Env      map[string]string `json:"env,omitempty"`
	Metadata map[string]string `json:"metadata,omitempty"`
	// Owner is the id of the key that created it.
	Owner     string    `json:"owner,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	// ExpiresAt is when a running sandbox is killed (or paused, with
	// AutoPause), and when a paused one is deleted.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	// AutoPause: paused instead of killed when its time is up, and resumed
	// by the next call that uses it.
	AutoPause bool `json:"auto_pause,omitempty"`
	// Network is set in the answer to a create with network mode nat.
	Network *Network `json:"network,omitempty"`
	// Volumes are the volumes mounted at create.
	Volumes []VolumeMount `json:"volumes,omitempty"`
}

// Limits are a sandbox's resource limits. Zero fields take the template's
// or the server's defaults when creating.
type Limits struct {
	CPUs        float64 `json:"cpus,omitempty"`
	MemoryBytes int64   `json:"memory_bytes,omitempty"`
	DiskBytes   int64   `json:"disk_bytes,omitempty"`
	Pids        int64   `json:"pids,omitempty"`
}

// CreateSandboxRequest is the body of POST /v1/sandboxes.
type CreateSandboxRequest struct {
	Template string            `json:"template,omitempty"` // default "base"
	Runtime  string            `json:"runtime,omitempty"`  // runsc (default) or runc
	Timeout  int64             `json:"timeout,omitempty"`  // seconds until it is killed; default 300
	Limits   Limits            `json:"limits,omitzero"`
	Env      map[string]string `json:"env,omitempty"`
	Metadata map[string]string `json:"metadata,omitempty"`
	// AutoPause pauses the sandbox instead of killing it when its timeout
	// expires; the next command, file or code call (or a resume) resumes
	// it, with its timeout starting over.
	AutoPause bool `json:"auto_pause,omitempty"`
	// Snapshot names one of the caller's snapshots to start from: the new
	// sandbox continues from its memory, processes and files, with its own
	// id, disk and env (the snapshot's, overlaid with Env). Template,
	// runtime and limits are the snapshot's (leave them unset).
	Snapshot string `json:"snapshot,omitempty"`
	// Network: nil or an empty mode takes the server's default.
	Network *Network `json:"network,omitempty"`
	// Volumes mounts the caller's volumes (see docs/volumes.md). A
	// sandbox with volumes cannot auto-pause, nor be paused, forked or
	// snapshotted.
	Volumes []VolumeMount `json:"volumes,omitempty"`
}

// SandboxList is the body of GET /v1/sandboxes.
type SandboxList struct {
	Sandboxes     []Sandbox `json:"sandboxes"`
	NextPageToken string    `json:"next_page_token,omitempty"`
}

// TimeoutRequest sets a sandbox's remaining lifetime, in seconds from now.
type TimeoutRequest struct {
	Timeout int64 `json:"timeout"`
}

// ForkRequest is the body of POST /v1/sandboxes/{id}/fork.
type ForkRequest struct {
	Count int `json:"count"` // forks to make, 1-16
}

// ForkResponse is the answer to POST /v1/sandboxes/{id}/fork: the new
// sandboxes, running.
type ForkResponse struct {
	Sandboxes []Sandbox `json:"sandboxes"`
}

// Usage is a sandbox's current resource use.
type Usage struct {
	CPUSeconds  float64 `json:"cpu_seconds"`
	MemoryBytes int64   `json:"memory_bytes"`
	MemoryLimit int64   `json:"memory_limit"`
	DiskBytes   int64   `json:"disk_bytes"`
	DiskLimit   int64   `json:"disk_limit"`
	Pids        int64   `json:"pids"`
}

// CommandRequest is the body of POST /v1/sandboxes/{id}/commands. Exactly
// one of Args or Cmd is set; Cmd runs as `bash -lc Cmd`.
type CommandRequest struct {
	Args    []string          `json:"args,omitempty"`
	Cmd     string            `json:"cmd,omitempty"`
	Cwd     string            `json:"cwd,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	User    string            `json:"user,omitempty"`    // "user" (default) or "root"
	Timeout float64           `json:"timeout,omitempty"` // seconds; default 60
	Tag     string            `json:"tag,omitempty"`
	Stdin   bool              `json:"stdin,omitempty"` // keep stdin open for writes
	PTY     *PTYSize          `json:"pty,omitempty"`
	// Background returns {pid} at once instead of streaming; attach later.
	Background bool `json:"background,omitempty"`
	// OutputLimit caps the bytes of output delivered (default 16 MiB).
	OutputLimit int64 `json:"output_limit,omitempty"`
}

// PTYSize is a terminal size.
type PTYSize struct {
	Cols uint16 `json:"cols"`
	Rows uint16 `json:"rows"`
}

// CommandStarted answers a background command.
type CommandStarted struct {
	PID int `json:"pid"`
}

// SignalRequest signals a command's process group.
type SignalRequest struct {
	Signal string `json:"signal"`
}

// PathRequest names a path (mkdir).
type PathRequest struct {
	Path string `json:"path"`
	User string `json:"user,omitempty"`
}

// MoveRequest renames a path.
type MoveRequest struct {
	From string `json:"from"`
	To   string `json:"to"`
	User string `json:"user,omitempty"`
}

// APIKey describes an API key; Secret is shown only when it is created.
type APIKey struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	Prefix    string    `json:"prefix"` // first characters, to recognise it
	Secret    string    `json:"secret,omitempty"`
	Admin     bool      `json:"admin,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	RevokedAt time.Time `json:"revoked_at,omitzero"`
	// Quotas; zero means the server's default.
	MaxSandboxes   int   `json:"max_sandboxes,omitempty"`
	MaxMemoryBytes int64 `json:"max_memory_bytes,omitempty"`
}

// CommandResult is the aggregated answer to a command run with
// Accept: application/json instead of a stream.
type CommandResult struct {
	PID    int        `json:"pid"`
	Stdout string     `json:"stdout"`
	Stderr string     `json:"stderr"`
	Exit   ExitStatus `json:"exit"`
}

// CreateKeyRequest is the body of POST /v1/keys (admin keys only).
type CreateKeyRequest struct {
	Name           string `json:"name"`
	Admin          bool   `json:"admin,omitempty"`
	MaxSandboxes   int    `json:"max_sandboxes,omitempty"`
	MaxMemoryBytes int64  `json:"max_memory_bytes,omitempty"`
}

// Health is the body of GET /healthz.
type Health struct {
	Status  string `json:"status"` // "ok"
	Version string `json:"version"`
}
