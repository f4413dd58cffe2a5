package sandbox

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/oci"
	"github.com/kiln-sh/kiln/internal/rootfs"
)

// reapInterval is how often expired sandboxes are looked for.
const reapInterval = time.Second

// timeout resolves a requested lifetime against the server's default and
// ceiling.
func (m *Manager) timeout(d time.Duration) (time.Duration, error) {
	l := m.cfg.Limits
	switch {
	case d == 0:
		return l.DefaultSandboxTimeout, nil
	case d < time.Second || d > l.MaxSandboxTimeout:
		return 0, fmt.Errorf("timeout %v outside [1s, %v]: %w", d, l.MaxSandboxTimeout, errdefs.ErrInvalidArgument)
	}
	return d, nil
}

// admit registers b as live unless that would take its owner past quota.
func (m *Manager) admit(b *box, q Quota) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if q.MaxSandboxes > 0 || q.MaxMemoryBytes > 0 {
		n, mem := 1, b.rec.Limits.MemoryBytes
		for _, o := range m.boxes {
			// rec.Owner and Limits never change after creation.
			if o.rec.Owner == b.rec.Owner {
				n++
				mem += o.rec.Limits.MemoryBytes
			}
		}
		if q.MaxSandboxes > 0 && n > q.MaxSandboxes {
			return fmt.Errorf("quota: at most %d concurrent sandboxes: %w", q.MaxSandboxes, errdefs.ErrResourceExhausted)
		}
		if q.MaxMemoryBytes > 0 && mem > q.MaxMemoryBytes {
			return fmt.Errorf("quota: at most %d MiB of sandbox memory in total: %w", q.MaxMemoryBytes>>20, errdefs.ErrResourceExhausted)
		}
	}
	m.boxes[b.rec.ID] = b
	return nil
}

// SetTimeout makes a running sandbox expire d from now.
func (m *Manager) SetTimeout(ctx context.Context, id ID, d time.Duration) (Sandbox, error) {
	d, err := m.timeout(d)
	if err != nil {
		return Sandbox{}, err
	}
	b, err := m.box(id)
	if err != nil {
		// A stopped or failed sandbox is known but cannot be extended.
		if rec, gerr := m.store.GetSandbox(ctx, id); gerr == nil {
			return Sandbox{}, fmt.Errorf("sandbox %s is %s: %w", id, rec.State, errdefs.ErrFailedPrecondition)
		}
		return Sandbox{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.rec.State != StateRunning && b.rec.State != StatePaused {
		return Sandbox{}, fmt.Errorf("sandbox %s is %s: %w", id, b.rec.State, errdefs.ErrFailedPrecondition)
	}
	rec := b.rec
	rec.ExpiresAt = time.Now().UTC().Add(d)
	if err := m.store.PutSandbox(ctx, rec); err != nil {
		return Sandbox{}, fmt.Errorf("recording timeout: %w", err)
	}
	b.rec = rec
	return rec, nil
}

// reaper kills sandboxes whose time is up.
func (m *Manager) reaper() {
	t := time.NewTicker(reapInterval)
	defer t.Stop()
	for {
		select {
		case <-m.done:
			return
		case now := <-t.C:
			for _, sb := range m.Live() {
				if sb.State != StateRunning || sb.ExpiresAt.IsZero() || now.Before(sb.ExpiresAt) {
					continue
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				if err := m.destroy(ctx, sb.ID, StateStopped, "timeout expired"); err != nil {
					m.log.Error("reaping expired sandbox", "sandbox_id", sb.ID, "err", err)
				} else {
					m.log.Info("reaped expired sandbox", "sandbox_id", sb.ID)
				}
				cancel()
			}
		}
	}
}

// Usage reports a live sandbox's resource use from its cgroup and layer.
func (m *Manager) Usage(ctx context.Context, id ID) (api.Usage, error) {
	b, err := m.box(id)
	if err != nil {
		return api.Usage{}, err
	}
	b.mu.Lock()
	rec, dir := b.rec, b.dir
	b.mu.Unlock()
	st, err := oci.CgroupStats(cgroupsPath(id))
	if err != nil {
		return api.Usage{}, fmt.Errorf("reading sandbox usage: %w", err)
	}
	u := api.Usage{
		CPUSeconds:  st.CPUUsage.Seconds(),
		MemoryBytes: st.MemoryUsage,
		MemoryLimit: rec.Limits.MemoryBytes,
		Pids:        st.Pids,
		DiskLimit:   rec.Limits.DiskBytes,
	}
	if used, _, err := rootfs.Usage(filepath.Join(dir, layerDir)); err == nil {
		u.DiskBytes = used
	}
	return u, nil
}
