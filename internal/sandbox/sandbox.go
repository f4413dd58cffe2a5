// Package sandbox owns the lifecycle of sandboxes on this host: the
// explicit state machine, creation (template layer, OCI bundle, runtime,
// agent handshake) with full unwinding on failure, kill, and re-adoption
// of running sandboxes after kiln serve restarts (Manager); and the
// checkpoint images of sandboxes, what they are restored as and the pools
// of ready sandboxes (Images, built on a Manager: images.go).
package sandbox

import (
	"cmp"
	"fmt"
	"strings"
	"time"

	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/template"
)

// Limits are one sandbox's resource limits.
type Limits struct {
	CPUs        float64 `json:"cpus"`
	MemoryBytes int64   `json:"memory_bytes"`
	DiskBytes   int64   `json:"disk_bytes"`
	Pids        int64   `json:"pids"`
}

// Sandbox is the record of one sandbox. Values returned by the Manager are
// copies; they do not change when the sandbox does.
type Sandbox struct {
	ID       ID     `json:"id"`
	Template string `json:"template"`
	// Build is the build of the custom template the sandbox started from
	// ("" for a built-in): a fork, restore or resume uses it, whatever the
	// template's name points at now.
	Build     string            `json:"build,omitempty"`
	Runtime   string            `json:"runtime"`
	State     State             `json:"state"`
	Reason    string            `json:"reason,omitempty"` // why it failed or stopped
	Limits    Limits            `json:"limits"`
	User      string            `json:"user"`
	Workdir   string            `json:"workdir"`
	Env       map[string]string `json:"env,omitempty"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	Owner     string            `json:"owner,omitempty"` // API key id; "" for local use
	Node      string            `json:"node,omitempty"`  // the kiln serve that runs it
	CreatedAt time.Time         `json:"created_at"`
	ExpiresAt time.Time         `json:"expires_at,omitzero"` // zero: never
	// AutoPause pauses the sandbox instead of killing it when its time is
	// up.
	AutoPause bool `json:"auto_pause,omitempty"`
	// AutoResume makes the next use of the sandbox while it is paused
	// resume it (see Manager.Wake).
	AutoResume bool `json:"auto_resume,omitempty"`
	// Timeout is the lifetime that create, SetTimeout and resume give it
	// (0: the server's default).
	Timeout time.Duration `json:"timeout,omitempty"`
	// PausedAt is when it was paused; zero unless it is paused.
	PausedAt time.Time `json:"paused_at,omitzero"`
	// EndedAt is when it became stopped or failed; zero while it lives.
	// Its record is kept, without Env and Metadata, for the server's
	// RetainEnded after that, then deleted (see Store).
	EndedAt time.Time `json:"ended_at,omitzero"`
	// Volumes are the persistent volumes mounted into it at create.
	Volumes []VolumeMount `json:"volumes,omitempty"`
	// Image is a paused sandbox's image in the shared snapshot dir
	// (KILN_SNAPSHOT_DIR), "<path>@sha256:<digest of its manifest>"
	// (shared.go); "" when it has none. Any node with that dir can resume
	// it, and its node's loss does not fail it.
	Image string `json:"image,omitempty"`
}

// Ended returns s as the record of an ended sandbox: state and reason
// set, EndedAt set to at unless it is already set, and the bulky fields
// that only a live sandbox needs (Env, Metadata) dropped.
func (s Sandbox) Ended(state State, reason string, at time.Time) Sandbox {
	s.State = state
	if reason != "" {
		s.Reason = reason
	}
	if s.EndedAt.IsZero() {
		s.EndedAt = at.UTC()
	}
	s.Env, s.Metadata, s.Image = nil, nil, ""
	return s
}

// CreateOptions say what sandbox to make. Zero values take the template's
// or the server's defaults.
type CreateOptions struct {
	Template string
	// TemplateBuild, when set, is the template to make the sandbox from,
	// given directly instead of by name (Template is then ignored): the
	// template builder's build sandboxes run on a build in progress.
	TemplateBuild *template.Template
	Runtime       string // runsc or runc
	Limits        Limits
	Env           map[string]string
	Metadata      map[string]string
	// Timeout is how long the sandbox lives unless extended; 0 means the
	// server's default.
	Timeout time.Duration
	Owner   string // API key id, "" for local use
	Quota   Quota  // the owner's limits across its live sandboxes
	// AutoPause pauses the sandbox instead of killing it when its timeout
	// expires (runsc: checkpoint; runc: freeze); a resume brings it back.
	AutoPause bool
	// AutoPauseFiles makes AutoPause keep only the files (PauseFiles):
	// the resume boots the sandbox afresh on them.
	AutoPauseFiles bool
	// AutoResume lets any use of the paused sandbox (a data-plane call
	// through an API) resume it.
	AutoResume bool
	// Snapshot names the owner's snapshot to make the sandbox from (see
	// Images.Snapshot); it fixes template, runtime and limits, and Env
	// is laid over the snapshot's.
	Snapshot string
	// Cold boots the sandbox even if a warm checkpoint or pool of its
	// template could serve it (benchmarks compare against it).
	Cold bool
	// Network: nil or a zero Mode takes the server's default.
	Network *NetworkOptions
	// Volumes mounts the owner's volumes (Config.Volumes binds them).
	// A sandbox with volumes boots cold, and cannot be paused, forked or
	// snapshotted, nor auto-pause.
	Volumes []VolumeMount
}

// Caps on a sandbox's metadata, checked on every create (native and E2B,
// fresh or from a snapshot): E2B documents none, these keep a record small
// enough that listing a full page of them stays cheap. Keys count towards
// the total as well as values.
const (
	MaxMetadataPairs      = 64
	MaxMetadataKeyBytes   = 256
	MaxMetadataValueBytes = 4 << 10
	MaxMetadataBytes      = 16 << 10
)

// MaxEnvBytes caps the total size of a create request's env (names and
// values): a process's whole environment must fit in the kernel's
// argument space anyway, and the record keeps it while the sandbox lives.
const MaxEnvBytes = 64 << 10

// validateRecordVars checks a create request's env and metadata: each
// entry (validateVars) and the caps above. Every create path calls it.
func validateRecordVars(env, md map[string]string) error {
	if err := validateVars("env", env, true); err != nil {
		return err
	}
	if err := validateEnvSize(env); err != nil {
		return err
	}
	return validateMetadata(md)
}

// validateMetadata checks metadata against the caps above; the messages
// echo at most a short prefix of a key.
func validateMetadata(md map[string]string) error {
	if len(md) > MaxMetadataPairs {
		return fmt.Errorf("metadata: %d pairs, at most %d: %w", len(md), MaxMetadataPairs, errdefs.ErrInvalidArgument)
	}
	total := 0
	for k, v := range md {
		switch {
		case k == "" || len(k) > MaxMetadataKeyBytes:
			return fmt.Errorf("metadata key %q: want 1-%d bytes: %w", clip(k), MaxMetadataKeyBytes, errdefs.ErrInvalidArgument)
		case len(v) > MaxMetadataValueBytes:
			return fmt.Errorf("metadata %q: value of %d bytes, at most %d: %w", clip(k), len(v), MaxMetadataValueBytes, errdefs.ErrInvalidArgument)
		case strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0):
			return fmt.Errorf("metadata %q: keys may not contain '=' or NUL, values not NUL: %w", clip(k), errdefs.ErrInvalidArgument)
		}
		total += len(k) + len(v)
	}
	if total > MaxMetadataBytes {
		return fmt.Errorf("metadata: %d bytes in all, at most %d: %w", total, MaxMetadataBytes, errdefs.ErrInvalidArgument)
	}
	return nil
}

// validateEnvSize checks the total size of env against MaxEnvBytes (the
// entries themselves are checked by validateVars).
func validateEnvSize(env map[string]string) error {
	total := 0
	for k, v := range env {
		total += len(k) + len(v) + 2 // "=" and the NUL after it
	}
	if total > MaxEnvBytes {
		return fmt.Errorf("env: %d bytes in all, at most %d: %w", total, MaxEnvBytes, errdefs.ErrInvalidArgument)
	}
	return nil
}

// clip shortens s for an error message.
func clip(s string) string {
	const n = 32
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// Quota bounds what one owner may hold at once; zero fields are unlimited.
type Quota struct {
	MaxSandboxes   int
	MaxMemoryBytes int64
}

// limitsFor resolves requested limits against template and server
// defaults and checks them against the ceilings.
func limitsFor(req Limits, tmpl Limits, cfg config.Limits) (Limits, error) {
	// Integers are picked as integers: through a float64, 2^63-1 became
	// -2^63 and the error quoted a negative size.
	l := Limits{
		CPUs:        cmp.Or(req.CPUs, tmpl.CPUs, cfg.DefaultCPUs),
		MemoryBytes: cmp.Or(req.MemoryBytes, tmpl.MemoryBytes, cfg.DefaultMemoryBytes),
		DiskBytes:   cmp.Or(req.DiskBytes, tmpl.DiskBytes, cfg.DefaultDiskBytes),
		Pids:        cmp.Or(req.Pids, tmpl.Pids, cfg.DefaultPids),
	}
	switch {
	case l.CPUs < 0.05 || l.CPUs > cfg.MaxCPUs:
		return l, fmt.Errorf("cpus %v outside [0.05, %v]: %w", l.CPUs, cfg.MaxCPUs, errdefs.ErrInvalidArgument)
	case l.MemoryBytes < 64*config.MiB || l.MemoryBytes > cfg.MaxMemoryBytes:
		return l, fmt.Errorf("memory of %d bytes outside [64 MiB, %d MiB]: %w", l.MemoryBytes, cfg.MaxMemoryBytes/config.MiB, errdefs.ErrInvalidArgument)
	case l.DiskBytes < 64*config.MiB || l.DiskBytes > cfg.MaxDiskBytes:
		return l, fmt.Errorf("disk of %d bytes outside [64 MiB, %d MiB]: %w", l.DiskBytes, cfg.MaxDiskBytes/config.MiB, errdefs.ErrInvalidArgument)
	case l.Pids < 16 || l.Pids > cfg.MaxPids:
		return l, fmt.Errorf("pids %d outside [16, %d]: %w", l.Pids, cfg.MaxPids, errdefs.ErrInvalidArgument)
	}
	return l, nil
}
