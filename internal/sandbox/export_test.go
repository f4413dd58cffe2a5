package sandbox

import (
	"context"
	"os"

	"github.com/kiln-sh/kiln/internal/template"
)

// AbandonPools stops filling the pools and forgets their sandboxes without
// destroying them, as a crash of kiln serve would leave them.
func (im *Images) AbandonPools() {
	p := im.pool()
	p.mu.Lock()
	p.closed = true
	p.cancel()
	p.ready = map[string][]*pooled{}
	p.mu.Unlock()
	<-p.done
}

// LeaveWarmBuildSandbox boots the sandbox a warm build of the template
// would, and leaves it, as a builder that crashed would.
func (im *Images) LeaveWarmBuildSandbox(ctx context.Context, name string) (ID, error) {
	tmpl, err := template.Lookup(im.cfg.DataDir, name)
	if err != nil {
		return "", err
	}
	limits, err := im.poolLimits(tmpl)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(tmpl.WarmSandboxDir(), 0o700); err != nil {
		return "", err
	}
	b, err := im.core.unlisted(ctx, tmpl, im.runtimes["runsc"], limits, nil, tmpl.WarmSandboxDir(), nil)
	if err != nil {
		return "", err
	}
	b.conn.Close()
	return b.rec.ID, nil
}

// InjectFaults makes the bring-up stages for which f returns an error fail
// with it (pipeline.go); nil removes the faults.
func (m *Manager) InjectFaults(f func(path, stage string, id ID) error) { m.faults = f }

// MakePooled brings up an unlisted sandbox of the named template as a pool
// fill does (warm if it can) and destroys it again.
func (im *Images) MakePooled(ctx context.Context, name string) error {
	tmpl, err := template.Lookup(im.cfg.DataDir, name)
	if err != nil {
		return err
	}
	limits, err := im.poolLimits(tmpl)
	if err != nil {
		return err
	}
	rt := im.runtimes[im.cfg.Runtime]
	ck, _ := im.warmCheckpoint(tmpl, rt, limits)
	b, err := im.core.unlisted(ctx, tmpl, rt, limits, ck, im.cfg.StateDir, nil)
	if err != nil {
		return err
	}
	im.core.discard(ctx, b)
	return nil
}

// UseCapabilities makes new sandboxes' PID 1 have caps (nil: the current
// set), as an older Kiln's did.
func (m *Manager) UseCapabilities(caps []string) { m.specCaps = caps }
