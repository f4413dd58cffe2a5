package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"

	"github.com/kiln-sh/kiln/internal/agentapi/channel"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/oci"
	"github.com/kiln-sh/kiln/internal/template"
)

// The bring-up paths that start from an image (pipeline.go): a template's
// warm checkpoint (warm), a fork's or a snapshot's image (restore). Images
// decides which image a sandbox comes from; the core brings it up.

// launch gives b (whose record and dir exist) a writable layer, a bundle
// and a running container whose agent answers, pushing an undo step for
// each. With a warm checkpoint ck of tmpl (from Images) it restores that;
// otherwise, or if that fails, it boots the agent, logging why when why
// (the reason there is no ck) says. It reports whether it restored.
//
// settle makes a warm restore return only once the warm kernel has its new
// env and seeds (pool fills, whose sandbox should be ready when claimed);
// otherwise that step runs while the caller goes on.
func (m *Manager) launch(ctx context.Context, b *box, rt oci.Runtime, tmpl *template.Template, ck *template.Checkpoint, why string, settle bool, c *cleanup) (_ *channel.Conn, warm bool, _ error) {
	// A networked sandbox restores the warm checkpoint (made without a
	// network) too: runsc's restore takes the interfaces of the sandbox's
	// namespace (TestSandboxNetworkWarm).
	if ck != nil {
		conn, err := m.restoreWarm(ctx, b, rt, tmpl, ck, settle, c)
		if err == nil {
			return conn, true, nil
		}
		if ctx.Err() != nil {
			return nil, false, err
		}
		why = "restoring the warm checkpoint failed: " + err.Error()
	}
	if why != "" {
		m.log.Info("booting cold", "sandbox_id", b.rec.ID, "template", tmpl.Name, "reason", why)
	}
	conn, err := m.bringUp(ctx, bringup{path: pathBoot, b: b, rt: rt, tmpl: tmpl}, c)
	return conn, false, err
}

// restoreWarm brings b up from the warm checkpoint ck: a copy of its
// layer image, a bundle of b's own (hostname, cgroup, limits), runsc
// restore on new FIFOs, a session and the identify call that gives the
// agent b's id and env. On failure it leaves b's dir empty (so b can boot
// instead); on success it hands its undo steps to c.
func (m *Manager) restoreWarm(ctx context.Context, b *box, rt oci.Runtime, tmpl *template.Template, ck *template.Checkpoint, settle bool, c *cleanup) (_ *channel.Conn, err error) {
	var mine cleanup
	mine.add(func(context.Context) error { return clearDir(b.dir) })
	defer func() {
		if err == nil {
			c.take(&mine)
		} else if uerr := mine.unwind(ctx); uerr != nil {
			m.log.Error("unwinding failed warm restore", "sandbox_id", b.rec.ID, "err", uerr)
		}
	}()
	return m.bringUp(ctx, bringup{
		path: pathWarm, b: b, rt: rt, tmpl: tmpl, disk: ck.Disk(), checkpoint: ck.Image(),
		identify: true, warmCode: warmKernelCode(tmpl.Warm, b.rec, true), settle: settle,
	}, &mine)
}

// restoreNew makes a new sandbox, rec (its id, times and env already set,
// state creating), from the image in dir (see capture) through the
// pipeline's restore path: its own record (admitted against the owner's
// quota q), dir, network if the image's sandbox had one, copy of the
// layer image mounted over tmpl, bundle with its own hostname and cgroup,
// runsc restore, a channel session and its identity (the restored agent
// still has the source's). On failure it unwinds what it made and returns
// a nil box; on success the sandbox is live and running.
func (m *Manager) restoreNew(ctx context.Context, rec Sandbox, tmpl *template.Template, dir string, q Quota) (*box, error) {
	p, err := m.prepareNew(ctx, rec, tmpl, dir, q, false)
	if err != nil {
		return nil, err
	}
	return m.finishNew(ctx, p)
}

// prepared is a new sandbox from an image brought up to its runtime
// stage (prepareNew): record, dir, network, layer and bundle made, and
// with precreate its container created too. finishNew restores the
// image's checkpoint into it; abort undoes it.
type prepared struct {
	u      bringup
	bundle *oci.Bundle
	c      cleanup
}

// prepareNew runs restoreNew's stages up to the runtime: all it needs of
// dir is the layer image, the capabilities and the network state (the
// checkpoint may still be being written). With create the container is
// created as well (see precreate). On failure it unwinds what it made.
func (m *Manager) prepareNew(ctx context.Context, rec Sandbox, tmpl *template.Template, dir string, q Quota, create bool) (_ *prepared, err error) {
	b := &box{dir: filepath.Join(m.cfg.StateDir, rec.ID.String()), rec: rec}
	p := &prepared{}
	defer func() {
		if err != nil {
			if uerr := p.abort(ctx); uerr != nil {
				m.log.Error("unwinding failed create", "sandbox_id", rec.ID, "err", uerr)
			}
		}
	}()
	caps, err := imageCaps(dir)
	if err != nil {
		return nil, err
	}
	if err := m.enroll(ctx, pathRestore, b, &q, &p.c); err != nil {
		return nil, err
	}
	if err := m.attachRestored(ctx, b, dir, &p.c); err != nil {
		return nil, err
	}
	p.u = bringup{
		path: pathRestore, b: b, rt: m.runtimes[rec.Runtime], tmpl: tmpl,
		disk: filepath.Join(dir, imageDisk), checkpoint: filepath.Join(dir, imageCheckpoint), identify: true,
		caps: caps,
	}
	if p.bundle, err = m.layerBundle(ctx, p.u, &p.c); err != nil {
		return nil, err
	}
	if create {
		if err := m.precreate(ctx, &p.u, p.bundle); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// finishNew runs a prepared sandbox's last stages: its checkpoint
// restored (into its container, if created), a session, its identity,
// state running. On failure it unwinds everything p made and returns a
// nil box.
func (m *Manager) finishNew(ctx context.Context, p *prepared) (_ *box, err error) {
	defer func() {
		if err != nil {
			if uerr := p.abort(ctx); uerr != nil {
				m.log.Error("unwinding failed create", "sandbox_id", p.u.b.rec.ID, "err", uerr)
			}
		}
	}()
	conn, err := m.startAgent(ctx, p.u, p.bundle, &p.c)
	if err != nil {
		return nil, err
	}
	if _, err := m.goLive(ctx, p.u.b, conn); err != nil {
		return nil, err
	}
	p.c.release()
	return p.u.b, nil
}

// abort undoes what prepareNew (and a failed finishNew) made.
func (p *prepared) abort(ctx context.Context) error { return p.c.unwind(ctx) }

// bundle is the OCI bundle of b on the layer mounted at root: the agent as
// PID 1 with b's env, hostname b's id, cgroup /kiln/<id> with b's limits.
// pidsCgroup is runc's user pids cgroup ("" for runsc); caps, if set, is
// the capability set (a restore's: its image's).
func (m *Manager) bundle(b *box, rt oci.Runtime, root, pidsCgroup string, caps []string) *oci.Bundle {
	if caps == nil {
		caps = m.specCaps
	}
	return &oci.Bundle{Dir: b.dir, Spec: oci.NewSpec(oci.SpecOptions{
		Rootfs:       root,
		Args:         []string{agentBinary},
		Env:          m.agentEnv(b.rec),
		Cwd:          "/",
		Hostname:     b.rec.ID.String(),
		Limits:       m.runtimeLimits(rt.Name(), b.rec.Limits),
		CgroupsPath:  cgroupsPath(b.rec.ID),
		AgentDir:     m.agentDir,
		PidsCgroup:   pidsCgroup,
		Runtime:      rt.Name(),
		Capabilities: caps,
		NetNS:        m.netNS(b.rec.ID),
		Binds:        volumeBinds(b),
	})}
}

// warmKernelCode is the code that gives the kernel the warm step started
// (running since the checkpoint, so identify's env does not reach it) the
// sandbox's id and env, and with reseed new random seeds: every restore of
// a checkpoint would otherwise draw the same "random" numbers. Only Python
// kernels are warmed this way today (nil for other templates); other
// languages' kernels are left as they are.
func warmKernelCode(w *template.Warm, rec Sandbox, reseed bool) *wire.ExecuteParams {
	if w == nil || w.Code == "" || w.Language != "python" {
		return nil
	}
	env := map[string]string{"KILN_SANDBOX_ID": rec.ID.String()}
	for k, v := range rec.Env {
		env[k] = v
	}
	b, _ := json.Marshal(env)
	code := fmt.Sprintf(`(lambda os, new: os.environ.update(new))(__import__("os"), %s)`, b)
	if reseed {
		code += "\n" + `(lambda sys: (__import__("random").seed(), sys.modules["numpy"].random.seed() if "numpy" in sys.modules else None) and None)(__import__("sys"))`
	}
	return &wire.ExecuteParams{Language: w.Language, Code: code, TimeoutMs: identifyTimeout.Milliseconds()}
}
