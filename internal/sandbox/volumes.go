package sandbox

import (
	"context"
	"fmt"
	"path"
	"strings"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/oci"
)

// VolumeMount mounts one of the owner's persistent volumes
// (internal/volume) into a sandbox at create.
type VolumeMount struct {
	Volume   string `json:"volume"` // the volume's id or name
	Path     string `json:"path"`   // absolute, in the sandbox
	ReadOnly bool   `json:"read_only,omitempty"`
}

// VolumeBinder binds volumes to sandboxes: internal/volume's Manager.
type VolumeBinder interface {
	// Bind resolves refs (ids or names of owner's volumes) for sandbox,
	// whose record exists, records that it mounts them and returns their
	// host directories, in order; a ref naming no volume of owner's is
	// errdefs.ErrInvalidArgument.
	Bind(ctx context.Context, owner, sandbox string, refs []string) ([]string, error)
}

// MaxVolumeMounts bounds the volumes of one sandbox.
const MaxVolumeMounts = 16

// reservedMountPaths are where no volume may be mounted (at or below):
// the kernel's file systems and the agent's own mount.
var reservedMountPaths = []string{"/proc", "/sys", "/dev", oci.AgentMount}

// validateVolumeMounts checks a create request's volume mounts: at most
// MaxVolumeMounts, each naming a volume, at a clean absolute path other
// than / and outside reservedMountPaths, no two at one path.
func validateVolumeMounts(vs []VolumeMount) error {
	if len(vs) > MaxVolumeMounts {
		return fmt.Errorf("volumes: %d mounts, at most %d: %w", len(vs), MaxVolumeMounts, errdefs.ErrInvalidArgument)
	}
	seen := make(map[string]bool, len(vs))
	for _, v := range vs {
		p := v.Path
		switch {
		case v.Volume == "":
			return fmt.Errorf("volumes: a mount names no volume: %w", errdefs.ErrInvalidArgument)
		case !path.IsAbs(p) || path.Clean(p) != p || len(p) > 4096 || strings.ContainsRune(p, 0):
			return fmt.Errorf("volume mount path %q: want a clean absolute path: %w", clip(p), errdefs.ErrInvalidArgument)
		case p == "/":
			return fmt.Errorf("volume mount path /: a volume cannot replace the root: %w", errdefs.ErrInvalidArgument)
		case seen[p]:
			return fmt.Errorf("volume mount path %q: used twice: %w", clip(p), errdefs.ErrInvalidArgument)
		}
		for _, r := range reservedMountPaths {
			if p == r || strings.HasPrefix(p, r+"/") {
				return fmt.Errorf("volume mount path %q: %s is reserved: %w", clip(p), r, errdefs.ErrInvalidArgument)
			}
		}
		seen[p] = true
	}
	return nil
}

// bindVolumes binds b's volumes (it is enrolled: its record exists) and
// keeps their host directories for its bundle.
func (m *Manager) bindVolumes(ctx context.Context, b *box) error {
	if len(b.rec.Volumes) == 0 {
		return nil
	}
	refs := make([]string, len(b.rec.Volumes))
	for i, v := range b.rec.Volumes {
		refs[i] = v.Volume
	}
	dirs, err := m.cfg.Volumes.Bind(ctx, b.rec.Owner, b.rec.ID.String(), refs)
	if err != nil {
		return fmt.Errorf("mounting volumes: %w", err)
	}
	b.volumeDirs = dirs
	return nil
}

// volumeBinds are the bind mounts of b's volumes in its bundle.
func volumeBinds(b *box) []oci.Bind {
	if len(b.volumeDirs) != len(b.rec.Volumes) {
		return nil
	}
	out := make([]oci.Bind, len(b.rec.Volumes))
	for i, v := range b.rec.Volumes {
		out[i] = oci.Bind{Source: b.volumeDirs[i], Destination: v.Path, ReadOnly: v.ReadOnly}
	}
	return out
}

// errVolumes refuses what a sandbox with volumes cannot do: an image of
// it (pause by checkpoint, fork, snapshot) would hold open files of a
// volume whose contents go on changing without it.
func errVolumes(id ID, verb string) error {
	return fmt.Errorf("sandbox %s has volumes mounted and cannot be %s: %w", id, verb, errdefs.ErrFailedPrecondition)
}

// checkVolumes checks a create request's volumes against what the server
// and the rest of the request allow.
func (m *Manager) checkVolumes(opts CreateOptions) error {
	if len(opts.Volumes) == 0 {
		return nil
	}
	if err := validateVolumeMounts(opts.Volumes); err != nil {
		return err
	}
	switch {
	case m.cfg.Volumes == nil:
		return fmt.Errorf("volumes: this server keeps none: %w", errdefs.ErrFailedPrecondition)
	case opts.AutoPause:
		return fmt.Errorf("volumes: a sandbox with volumes cannot auto-pause: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}
