package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/kiln-sh/kiln/internal/agentapi/channel"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/oci"
	"github.com/kiln-sh/kiln/internal/rootfs"
	"github.com/kiln-sh/kiln/internal/template"
)

// The one bring-up pipeline. Every way a sandbox comes up runs the same
// stages, in this order, each pushing the undo step of what it made onto
// one cleanup stack:
//
//	record → dir → network → layer → bundle → runtime → connect → identify
//
// A path uses the stages it needs: a create records and admits, an
// unlisted (pooled, warm-build) sandbox does not; a boot makes an empty
// layer and starts the agent, a restore copies a layer image and restores
// a checkpoint; only restored agents are told who they are now; a resume
// has its dir, layer and bundle and runs from the runtime stage on.
// The caller releases the stack on success and unwinds it on failure.

// Bring-up paths, named in logs and for fault injection.
const (
	pathBoot    = "boot"    // an empty layer over the template, the agent started
	pathWarm    = "warm"    // a template's warm checkpoint restored
	pathRestore = "restore" // a fork's or a snapshot's image restored as a new sandbox
	pathResume  = "resume"  // a paused sandbox restored in place
	pathReboot  = "reboot"  // a paused sandbox booted afresh on its layer
	pathMove    = "move"    // a paused sandbox restored from the shared snapshot dir on another node
	pathPool    = "pool"    // an unlisted sandbox (pool, warm build): its dir; then boot or warm
)

// Pipeline stages, in order.
const (
	stageRecord   = "record"   // admitted against the quota, record stored
	stageDir      = "dir"      // state dir
	stageNetwork  = "network"  // network namespaces (mode nat)
	stageLayer    = "layer"    // writable layer mounted over the template
	stageBundle   = "bundle"   // OCI bundle (and runc's user pids cgroup)
	stageRuntime  = "runtime"  // container created and started, or restored
	stageConnect  = "connect"  // channel session with the agent
	stageIdentify = "identify" // a restored agent told its new id and env
)

// bringup says how one sandbox comes up.
type bringup struct {
	path string
	b    *box
	rt   oci.Runtime
	tmpl *template.Template // the layer's lower dir
	// disk is a layer image to start from (copied); "" makes an empty
	// layer of the sandbox's disk limit.
	disk string
	// checkpoint is a runsc image dir to restore; "" boots the agent.
	checkpoint string
	// caps is the capability set the checkpoint was made with (nil: the
	// current one).
	caps []string
	// identify tells a restored agent its new id and env, then runs
	// warmCode (the warm kernel's env update) in the background, or before
	// returning with settle.
	identify bool
	warmCode *wire.ExecuteParams
	settle   bool
	// created says the container exists already (runsc create done, not
	// started: precreate): the restore goes into it, without spawning
	// the sandbox and gofer processes.
	created bool
}

// fault returns the error a test injected at stage of path for sandbox
// id, if any.
func (m *Manager) fault(path, stage string, id ID) error {
	if m.faults == nil {
		return nil
	}
	if err := m.faults(path, stage, id); err != nil {
		return fmt.Errorf("%s of %s: %w", stage, path, err)
	}
	return nil
}

// enroll runs the first stages for b: with a quota q, admission into the
// live set and the record (state creating: a crash from here on leaves a
// trace for the next start to clean up); then b's state dir.
func (m *Manager) enroll(ctx context.Context, path string, b *box, q *Quota, c *cleanup) error {
	id := b.rec.ID
	if q != nil {
		if err := m.fault(path, stageRecord, id); err != nil {
			return err
		}
		if err := m.admit(b, *q); err != nil {
			return err
		}
		c.add(func(context.Context) error { m.forget(id); return nil })
		// Undone even when the write failed: it may have been committed
		// without its answer arriving (a catalog that went down).
		c.add(func(ctx context.Context) error { return m.deleteRecord(ctx, id) })
		if err := m.store.PutSandbox(ctx, b.rec); err != nil {
			return fmt.Errorf("recording sandbox: %w", err)
		}
	}
	if err := m.fault(path, stageDir, id); err != nil {
		return err
	}
	if err := os.Mkdir(b.dir, 0o700); err != nil {
		return fmt.Errorf("creating sandbox dir: %w", err)
	}
	c.add(func(context.Context) error { return os.RemoveAll(b.dir) })
	return nil
}

// deleteRecord deletes the record of a create being unwound. A catalog
// that is unavailable (down, restarting) gets it retried in the
// background until it takes it or the Manager closes: no record may
// outlive its sandbox. A node that stops first leaves the record to its
// next start, whose adoption fails records without a sandbox.
func (m *Manager) deleteRecord(ctx context.Context, id ID) error {
	err := m.store.DeleteSandbox(ctx, id)
	if !errors.Is(err, errdefs.ErrUnavailable) {
		return err
	}
	m.log.Warn("the catalog is unavailable: deleting the record of a failed create once it is back", "sandbox_id", id, "err", err)
	go func() {
		for {
			select {
			case <-m.done:
				return
			case <-time.After(time.Second):
			}
			dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := m.store.DeleteSandbox(dctx, id)
			cancel()
			if err == nil {
				m.log.Info("deleted the record of a failed create", "sandbox_id", id)
				return
			}
		}
	}()
	return nil
}

// forget drops a sandbox from the live set.
func (m *Manager) forget(id ID) {
	m.mu.Lock()
	delete(m.boxes, id)
	m.mu.Unlock()
}

// bringUp runs the stages from the layer on: the writable layer, the
// bundle, then startAgent. b's dir exists (and its network, if any).
func (m *Manager) bringUp(ctx context.Context, u bringup, c *cleanup) (*channel.Conn, error) {
	t0 := time.Now()
	bundle, err := m.layerBundle(ctx, u, c)
	if err != nil {
		return nil, err
	}
	t1 := time.Now()
	conn, err := m.startAgent(ctx, u, bundle, c)
	if err != nil {
		return nil, err
	}
	m.log.Debug("sandbox brought up", "sandbox_id", u.b.rec.ID, "path", u.path, "layer", t1.Sub(t0), "agent", time.Since(t1))
	return conn, nil
}

// layerBundle runs the layer and bundle stages: the writable layer
// mounted, the bundle written; the container's undo step goes with the
// bundle.
func (m *Manager) layerBundle(ctx context.Context, u bringup, c *cleanup) (*oci.Bundle, error) {
	b, id := u.b, u.b.rec.ID
	if err := m.fault(u.path, stageLayer, id); err != nil {
		return nil, err
	}
	var layer *rootfs.Layer
	var err error
	if u.disk == "" {
		layer, err = rootfs.Mount(ctx, u.tmpl.Rootfs, filepath.Join(b.dir, layerDir), b.rec.Limits.DiskBytes)
	} else {
		layer, err = rootfs.MountImage(ctx, u.tmpl.Rootfs, filepath.Join(b.dir, layerDir), u.disk)
	}
	if err != nil {
		return nil, fmt.Errorf("mounting writable layer: %w", err)
	}
	c.add(func(ctx context.Context) error { return rootfs.Unmount(ctx, layer.Dir()) })
	if u.disk == "" { // a fresh layer; an image copy has its source's
		if err := ensureHosts(layer.Rootfs(), id.String()); err != nil {
			return nil, err
		}
	}

	if err := m.fault(u.path, stageBundle, id); err != nil {
		return nil, err
	}
	pidsCgroup, err := userPids(b, u.rt, c)
	if err != nil {
		return nil, err
	}
	bundle := m.bundle(b, u.rt, layer.Rootfs(), pidsCgroup, u.caps)
	if err := bundle.Write(); err != nil {
		return nil, err
	}
	c.add(func(ctx context.Context) error { return deleteContainer(ctx, u.rt, id, b.dir, b.procs.get()) })
	return bundle, nil
}

// userPids makes runc's user pids cgroup for b (none for other runtimes)
// and pushes its undo onto c; it returns its path ("" for none).
func userPids(b *box, rt oci.Runtime, c *cleanup) (string, error) {
	if rt.Name() != "runc" {
		return "", nil
	}
	id := b.rec.ID
	pidsCgroup, err := makeUserPidsCgroup(id, b.rec.Limits.Pids)
	if err != nil {
		return "", err
	}
	c.add(func(context.Context) error {
		if err := removeUserPidsCgroup(id); err != nil {
			return err
		}
		// Its parent is the container's cgroup, which the runtime
		// removes; a bring-up that failed before the runtime made the
		// container leaves it to us.
		if err := os.Remove(filepath.Dir(pidsCgroup)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("removing container cgroup: %w", err)
		}
		return nil
	})
	return pidsCgroup, nil
}

// startAgent runs the last stages: the container is created and started
// (or restored from u.checkpoint) with the agent's stdio on b's FIFOs,
// the runtime's pids are learnt in the background, a channel session
// opens, and a restored agent gets its identity. The container's undo
// step is the caller's (it belongs with the bundle).
func (m *Manager) startAgent(ctx context.Context, u bringup, bundle *oci.Bundle, c *cleanup) (*channel.Conn, error) {
	b, id := u.b, u.b.rec.ID
	if err := m.fault(u.path, stageRuntime, id); err != nil {
		return nil, err
	}
	if u.checkpoint == "" {
		if err := m.start(ctx, u.rt, id, bundle); err != nil {
			return nil, err
		}
	} else if err := m.restoreContainer(ctx, u, bundle); err != nil {
		return nil, err
	}
	b.procs = learnProcs(u.rt, id.String())

	if err := m.fault(u.path, stageConnect, id); err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	// A booted agent's FIFOs never had a session; a restored agent may
	// have been mid-frame (Connect pads, it resynchronises on the preface).
	conn, err := connect(cctx, b.dir, u.checkpoint == "")
	if err != nil {
		what := "connecting to the restored agent"
		if u.checkpoint == "" {
			what = "waiting for the agent"
		}
		return nil, fmt.Errorf("%s: %w%s", what, err, agentLogTail(b.dir))
	}
	c.add(func(context.Context) error { return conn.Close() })

	if u.identify {
		if err := m.fault(u.path, stageIdentify, id); err != nil {
			return nil, err
		}
		if err := m.identify(ctx, conn, b.rec, u.warmCode, u.settle); err != nil {
			return nil, err
		}
	}
	return conn, nil
}

// precreate creates u's container from bundle with the agent's stdio on
// b's FIFOs, not started: the sandbox and gofer processes are spawned
// now, and a later restore (u.created) goes into it. Paths run it while
// something the restore waits for is still being done (Fork: while the
// source is checkpointed). The container's undo step is the bundle's.
func (m *Manager) precreate(ctx context.Context, u *bringup, bundle *oci.Bundle) error {
	if err := m.fault(u.path, stageRuntime, u.b.rec.ID); err != nil {
		return err
	}
	if err := m.createContainer(ctx, u.rt, u.b.rec.ID, bundle); err != nil {
		return err
	}
	u.created = true
	return nil
}

// restoreContainer restores u's checkpoint as b's container, on new
// handles of b's FIFOs, or into the container precreate made, which
// has them.
func (m *Manager) restoreContainer(ctx context.Context, u bringup, bundle *oci.Bundle) error {
	ck, ok := u.rt.(oci.Checkpointer)
	if !ok {
		return fmt.Errorf("runtime %s cannot restore a checkpoint", u.rt.Name())
	}
	var io oci.IO
	if !u.created {
		files, err := openStdio(u.b.dir)
		if err != nil {
			return err
		}
		defer func() {
			for _, f := range files {
				f.Close()
			}
		}()
		io = oci.IO{Stdin: files[0], Stdout: files[1], Stderr: files[2]}
	}
	err := ck.Restore(ctx, u.b.rec.ID.String(), bundle, u.checkpoint, io)
	if err != nil {
		if u.path == pathWarm {
			return fmt.Errorf("restoring warm checkpoint: %w", err)
		}
		return fmt.Errorf("restoring container: %w", err)
	}
	return nil
}

// goLive makes a brought-up sandbox running: state running (persisted),
// its session, and the watch that fails it if the session ends on its own.
// It returns the record as of then.
func (m *Manager) goLive(ctx context.Context, b *box, conn *channel.Conn) (Sandbox, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := m.transition(ctx, b, StateRunning, ""); err != nil {
		return Sandbox{}, err
	}
	b.conn = conn
	go m.watch(b, conn)
	return b.rec, nil
}
