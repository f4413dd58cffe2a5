package sandbox

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/oci"
	"github.com/kiln-sh/kiln/internal/rootfs"
)

// reapInterval is how often expired sandboxes are looked for.
const reapInterval = time.Second

// pruneEvery is how often the records of sandboxes that ended more than
// RetainEnded ago are deleted, and pruneBatch how many one statement
// deletes (a short write transaction, however many are due).
const (
	pruneEvery = time.Minute
	pruneBatch = 500
)

// timeout resolves a requested lifetime against the server's default and
// ceiling.
func (c *Config) timeout(d time.Duration) (time.Duration, error) {
	l := c.Limits
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
			// rec.Owner and Limits never change while a box is live,
			// and other fields are written one by one under o.mu, so
			// these reads need only m.mu.
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
	d, err := m.cfg.timeout(d)
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
	// A paused sandbox keeps its deletion time; its timeout applies from
	// its resume.
	rec.Timeout = d
	if rec.State == StateRunning {
		rec.ExpiresAt = time.Now().UTC().Add(d)
	}
	if err := m.store.PutSandbox(ctx, rec); err != nil {
		return Sandbox{}, fmt.Errorf("recording timeout: %w", err)
	}
	b.rec.Timeout, b.rec.ExpiresAt = rec.Timeout, rec.ExpiresAt // field by field: see admit
	return rec, nil
}

// reaper ends sandboxes whose time is up: running ones are killed, or
// paused if they have AutoPause; paused ones are deleted once they have
// been paused for MaxPausedLifetime. It also deletes the records of
// sandboxes that ended more than RetainEnded ago.
//
// Expirations run beside each other, up to reapConcurrency at once: one
// at a time, a slow pause (a checkpoint on a loaded host) or a sandbox
// whose lock a long snapshot holds kept every other expired sandbox
// running past its time (CI 19: a 3 s sandbox still ran a minute later).
func (m *Manager) reaper() {
	t := time.NewTicker(reapInterval)
	defer t.Stop()
	var pruned time.Time
	var mu sync.Mutex
	inFlight := map[ID]bool{}
	slots := make(chan struct{}, reapConcurrency)
	for {
		select {
		case <-m.done:
			return
		case now := <-t.C:
			if retain := m.cfg.Limits.RetainEnded; retain > 0 && now.Sub(pruned) >= min(pruneEvery, retain/2) {
				pruned = now
				m.pruneEnded(now.Add(-retain))
			}
		expire:
			for _, sb := range m.Live() {
				mu.Lock()
				busy := inFlight[sb.ID]
				mu.Unlock()
				if busy || !expired(sb, now) {
					continue
				}
				select {
				case slots <- struct{}{}:
				default:
					break expire // the rest wait for a free slot at the next tick
				}
				mu.Lock()
				inFlight[sb.ID] = true
				mu.Unlock()
				go func() {
					defer func() {
						mu.Lock()
						delete(inFlight, sb.ID)
						mu.Unlock()
						<-slots
					}()
					ctx, cancel := context.WithTimeout(context.Background(), expireTimeout)
					defer cancel()
					m.expire(ctx, sb.ID, now)
				}()
			}
		}
	}
}

// reapConcurrency is how many expired sandboxes the reaper ends at once;
// expireTimeout bounds one (a pause that fails kills the sandbox, so the
// bound is generous).
const (
	reapConcurrency = 4
	expireTimeout   = 3 * time.Minute
)

// pruneEnded deletes the records of sandboxes that ended before cutoff,
// a batch at a time, for at most a minute (the rest wait for the next
// round).
func (m *Manager) pruneEnded(cutoff time.Time) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	total := 0
	for {
		n, err := m.store.DeleteEnded(ctx, cutoff, pruneBatch)
		total += n
		if err != nil {
			m.log.Error("deleting records of ended sandboxes", "err", err)
			break
		}
		if n < pruneBatch {
			break
		}
	}
	if total > 0 {
		m.log.Info("deleted records of ended sandboxes", "count", total, "ended_before", cutoff.UTC())
	}
}

// expired reports whether sb's time is up at now.
func expired(sb Sandbox, now time.Time) bool {
	return (sb.State == StateRunning || sb.State == StatePaused) && !sb.ExpiresAt.IsZero() && !now.Before(sb.ExpiresAt)
}

// expire ends an expired sandbox, checking again under its lock (its
// timeout may just have been extended).
func (m *Manager) expire(ctx context.Context, id ID, now time.Time) {
	b, err := m.box(id)
	if err != nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !expired(b.rec, now) {
		return
	}
	_ = m.expireLocked(ctx, b)
}

// ExpireNow ends a running sandbox at once, as its timeout would: it is
// paused if it has AutoPause (killed if that fails), else killed. E2B's
// setTimeout(0) does this. A sandbox that is not running is refused.
func (m *Manager) ExpireNow(ctx context.Context, id ID) (Sandbox, error) {
	b, err := m.box(id)
	if err != nil {
		return Sandbox{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.rec.State != StateRunning {
		return Sandbox{}, fmt.Errorf("sandbox %s is %s: %w", id, b.rec.State, errdefs.ErrFailedPrecondition)
	}
	err = m.expireLocked(ctx, b)
	return b.rec, err
}

// expireLocked ends an expired sandbox: a paused one is deleted, a
// running one paused (AutoPause) or killed. Callers hold b.mu.
func (m *Manager) expireLocked(ctx context.Context, b *box) error {
	id := b.rec.ID
	log := m.log.With("sandbox_id", id)
	reason := "timeout expired"
	switch {
	case b.rec.State == StatePaused:
		reason = fmt.Sprintf("paused for longer than %v", m.cfg.Limits.MaxPausedLifetime)
	case b.rec.AutoPause:
		_, err := m.pauseLocked(ctx, b, !autoPauseFiles(b.dir))
		if err == nil {
			log.Info("auto-paused expired sandbox")
			return nil
		}
		log.Error("auto-pausing expired sandbox; killing it instead", "err", err)
		reason = "timeout expired; pausing it failed: " + err.Error()
	}
	if err := m.destroyLocked(ctx, b, StateStopped, reason); err != nil {
		log.Error("reaping expired sandbox", "err", err)
		return err
	}
	log.Info("reaped expired sandbox", "reason", reason)
	return nil
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
