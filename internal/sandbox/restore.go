package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/oci"
	"github.com/kiln-sh/kiln/internal/rootfs"
	"github.com/kiln-sh/kiln/internal/template"
)

// An image of a running sandbox, as made by capture and used by
// restoreNew: a runsc checkpoint and a copy of the writable layer's disk
// image taken while the sandbox was frozen, so the two match. Forks keep
// one in a temporary dir, snapshots under the snapshot dir.
const (
	imageCheckpoint = checkpointDir // dir: runsc checkpoint --image-path
	imageDisk       = "disk.img"    // sparse copy of the layer's ext4 image
)

// capture freezes a running runsc sandbox, checkpoints it into dir with
// --leave-running and copies its layer image there, then thaws it: the
// sandbox is frozen for about a tenth of a second and keeps running. It
// returns the source's record as of the image. verb names the operation
// in errors ("forked", "snapshotted").
func (m *Manager) capture(ctx context.Context, b *box, dir, verb string) (_ Sandbox, _ oci.Checkpointer, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	id := b.rec.ID
	ck, p, err := m.capturable(b.rec, verb)
	if err != nil {
		return Sandbox{}, nil, err
	}
	if err := p.Pause(ctx, id.String()); err != nil {
		return Sandbox{}, nil, fmt.Errorf("freezing sandbox: %w", err)
	}
	defer func() {
		if rerr := p.Resume(context.WithoutCancel(ctx), id.String()); rerr != nil {
			m.log.Error("thawing sandbox after its image was taken", "sandbox_id", id, "err", rerr)
			if err == nil {
				err = fmt.Errorf("thawing sandbox %s: %w", id, rerr)
			}
		}
	}()
	if err := ck.Checkpoint(ctx, id.String(), filepath.Join(dir, imageCheckpoint), true); err != nil {
		return Sandbox{}, nil, fmt.Errorf("checkpointing sandbox: %w", err)
	}
	// Frozen, nothing writes to the layer: flush it and copy its image,
	// which then matches the memory image.
	layer := filepath.Join(b.dir, layerDir)
	if err := rootfs.Sync(layer); err != nil {
		return Sandbox{}, nil, err
	}
	if err := rootfs.CopySparse(filepath.Join(dir, imageDisk), rootfs.ImagePath(layer)); err != nil {
		if errors.Is(err, syscall.ENOSPC) {
			err = fmt.Errorf("%w: %w", err, errdefs.ErrResourceExhausted)
		}
		return Sandbox{}, nil, fmt.Errorf("copying layer image: %w", err)
	}
	if err := keepNetwork(b.dir, dir); err != nil {
		return Sandbox{}, nil, err
	}
	rec := b.rec
	rec.Env, rec.Metadata = maps.Clone(rec.Env), maps.Clone(rec.Metadata)
	return rec, ck, nil
}

// capturable checks that an image of rec can be taken (see capture) and
// returns its runtime's abilities to do so.
func (m *Manager) capturable(rec Sandbox, verb string) (oci.Checkpointer, oci.Pauser, error) {
	if rec.State != StateRunning {
		return nil, nil, fmt.Errorf("sandbox %s is %s; only running sandboxes can be %s: %w", rec.ID, rec.State, verb, errdefs.ErrFailedPrecondition)
	}
	rt := m.runtimes[rec.Runtime]
	ck, ok := rt.(oci.Checkpointer)
	p, okp := rt.(oci.Pauser)
	if !ok || !ck.CanCheckpoint() || !okp {
		return nil, nil, fmt.Errorf("sandbox %s runs on %s, which cannot checkpoint; only runsc sandboxes can be %s: %w", rec.ID, rec.Runtime, verb, errdefs.ErrFailedPrecondition)
	}
	return ck, p, nil
}

// restoreNew makes a new sandbox, rec (its id, times and env already set,
// state creating), from the image in dir: its own record, dir, copy of
// the layer image mounted over tmpl, bundle with its own hostname and
// cgroup, runsc restore, a channel session and its identity (the restored
// agent still has the source's). q is the owner's quota. On failure it
// unwinds what it made and returns a nil box; on success the sandbox is
// live and running.
func (m *Manager) restoreNew(ctx context.Context, rec Sandbox, tmpl *template.Template, ck oci.Checkpointer, dir string, q Quota) (_ *box, err error) {
	id := rec.ID
	b := &box{dir: filepath.Join(m.cfg.StateDir, id.String()), rec: rec}
	rt := m.runtimes[rec.Runtime]
	log := m.log.With("sandbox_id", id)

	var undo []func(context.Context) error
	defer func() {
		if err != nil {
			m.unwind(ctx, id, undo, log)
		}
	}()
	if err := m.admit(b, q); err != nil {
		return nil, err
	}
	if err := m.store.PutSandbox(ctx, b.rec); err != nil {
		return nil, fmt.Errorf("recording sandbox: %w", err)
	}
	undo = append(undo, func(ctx context.Context) error { return m.store.DeleteSandbox(ctx, id) })
	if err := os.Mkdir(b.dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating sandbox dir: %w", err)
	}
	undo = append(undo, func(context.Context) error { return os.RemoveAll(b.dir) })
	layer, err := rootfs.MountImage(ctx, tmpl.Rootfs, filepath.Join(b.dir, layerDir), filepath.Join(dir, imageDisk))
	if err != nil {
		return nil, fmt.Errorf("mounting writable layer: %w", err)
	}
	undo = append(undo, func(ctx context.Context) error { return rootfs.Unmount(ctx, layer.Dir()) })
	if err := m.attachRestored(ctx, b, dir, &undo); err != nil {
		return nil, err
	}
	bundle := &oci.Bundle{Dir: b.dir, Spec: oci.NewSpec(oci.SpecOptions{
		Rootfs:      layer.Rootfs(),
		Args:        []string{agentBinary},
		Env:         m.agentEnv(b.rec),
		Cwd:         "/",
		Hostname:    id.String(),
		Limits:      m.runtimeLimits(rt.Name(), rec.Limits),
		CgroupsPath: cgroupsPath(id),
		AgentDir:    m.agentDir,
		Runtime:     rt.Name(),
		NetNS:       m.netNS(id),
	})}
	if err := bundle.Write(); err != nil {
		return nil, err
	}
	undo = append(undo, func(ctx context.Context) error { return deleteContainer(ctx, rt, id, b.dir, b.procs.get()) })
	files, err := openStdio(b.dir)
	if err != nil {
		return nil, err
	}
	err = ck.Restore(ctx, id.String(), bundle, filepath.Join(dir, imageCheckpoint), oci.IO{Stdin: files[0], Stdout: files[1], Stderr: files[2]})
	for _, f := range files {
		f.Close()
	}
	if err != nil {
		return nil, fmt.Errorf("restoring container: %w", err)
	}
	b.procs = learnProcs(rt, id.String())
	cctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	conn, err := connect(cctx, b.dir, false)
	if err != nil {
		return nil, fmt.Errorf("connecting to the restored agent: %w%s", err, agentLogTail(b.dir))
	}
	undo = append(undo, func(context.Context) error { return conn.Close() })
	if err := m.identify(ctx, conn, b.rec, nil, false); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := m.transition(ctx, b, StateRunning, ""); err != nil {
		return nil, err
	}
	b.conn = conn
	go m.watch(b, conn)
	return b, nil
}

// unwind runs the undo steps of a failed create in reverse, with a
// context that outlives the caller's, and forgets the sandbox.
func (m *Manager) unwind(ctx context.Context, id ID, undo []func(context.Context) error, log *slog.Logger) {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	for i := len(undo) - 1; i >= 0; i-- {
		if err := undo[i](uctx); err != nil {
			log.Error("unwinding failed create", "err", err)
		}
	}
	m.mu.Lock()
	delete(m.boxes, id)
	m.mu.Unlock()
}

// checkRequest validates a create request's env, metadata and timeout,
// and resolves the timeout.
func (m *Manager) checkRequest(opts CreateOptions) (time.Duration, error) {
	if err := validateVars("env", opts.Env, true); err != nil {
		return 0, err
	}
	if err := validateVars("metadata", opts.Metadata, false); err != nil {
		return 0, err
	}
	return m.timeout(opts.Timeout)
}
