package sandbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/oci"
	"github.com/kiln-sh/kiln/internal/rootfs"
	"github.com/kiln-sh/kiln/internal/template"
)

// MaxForks is the most sandboxes one Fork makes.
const MaxForks = 16

// forkTmpPrefix names the dirs in the state dir that hold a fork's
// snapshot (checkpoint and layer image) while the forks are made.
const forkTmpPrefix = ".fork-"

// Fork makes count new sandboxes that continue from a running runsc
// sandbox's current state (memory, processes, files) and then diverge
// independently; the source keeps running. Each fork gets a new id, its
// own copy of the source's writable layer, the source's owner, template,
// limits, env and metadata, and the server's default timeout; q is the
// owner's quota, checked for each fork.
//
// The source is frozen while it is checkpointed (runsc checkpoint
// --leave-running) and its layer image copied, then thawed; the forks are
// restored from that image in parallel. Either all forks are made or none:
// a failure unwinds every fork made so far. The source is left running
// whatever happens (unless thawing it fails, which is returned).
func (m *Manager) Fork(ctx context.Context, id ID, count int, q Quota) (_ []Sandbox, err error) {
	if count < 1 || count > MaxForks {
		return nil, fmt.Errorf("fork count %d outside [1, %d]: %w", count, MaxForks, errdefs.ErrInvalidArgument)
	}
	b, err := m.box(id)
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	tmp, err := os.MkdirTemp(m.cfg.StateDir, forkTmpPrefix)
	if err != nil {
		return nil, fmt.Errorf("creating fork dir: %w", err)
	}
	defer os.RemoveAll(tmp)
	img, disk := filepath.Join(tmp, checkpointDir), filepath.Join(tmp, "disk.img")
	src, ck, err := m.snapshot(ctx, b, img, disk)
	if err != nil {
		return nil, err
	}
	t1 := time.Now()
	tmpl, err := template.Lookup(m.cfg.DataDir, src.Template)
	if err != nil {
		return nil, fmt.Errorf("template of sandbox %s: %w", id, err)
	}
	forks := make([]*box, count)
	errs := make([]error, count)
	var wg sync.WaitGroup
	for i := range forks {
		wg.Go(func() { forks[i], errs[i] = m.forkOne(ctx, src, tmpl, ck, img, disk, q) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		for _, f := range forks {
			if f == nil {
				continue
			}
			if derr := m.destroy(uctx, f.rec.ID, StateStopped, "fork failed"); derr != nil && !errors.Is(derr, errdefs.ErrNotFound) {
				m.log.Error("unwinding failed fork", "sandbox_id", f.rec.ID, "err", derr)
			}
			// A fork is all or nothing: its records go too.
			if derr := m.store.DeleteSandbox(uctx, f.rec.ID); derr != nil {
				m.log.Error("unwinding failed fork", "sandbox_id", f.rec.ID, "err", derr)
			}
		}
		return nil, fmt.Errorf("forking sandbox %s: %w", id, errs[firstErr(errs)])
	}
	out := make([]Sandbox, count)
	ids := make([]string, count)
	for i, f := range forks {
		f.mu.Lock()
		out[i] = f.rec
		f.mu.Unlock()
		ids[i] = f.rec.ID.String()
	}
	m.log.Info("sandbox forked", "sandbox_id", id, "forks", ids, "snapshot", t1.Sub(t0), "total", time.Since(t0))
	return out, nil
}

func firstErr(errs []error) int {
	for i, e := range errs {
		if e != nil {
			return i
		}
	}
	return 0
}

// snapshot freezes a running runsc sandbox, checkpoints it to img with
// --leave-running and copies its layer image to disk, then thaws it. It
// returns the source's record as of the snapshot.
func (m *Manager) snapshot(ctx context.Context, b *box, img, disk string) (_ Sandbox, _ oci.Checkpointer, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	id := b.rec.ID
	if b.rec.State != StateRunning {
		return Sandbox{}, nil, fmt.Errorf("sandbox %s is %s; only running sandboxes can be forked: %w", id, b.rec.State, errdefs.ErrFailedPrecondition)
	}
	rt := m.runtimes[b.rec.Runtime]
	ck, ok := rt.(oci.Checkpointer)
	p, okp := rt.(oci.Pauser)
	if !ok || !ck.CanCheckpoint() || !okp {
		return Sandbox{}, nil, fmt.Errorf("sandbox %s runs on %s, which cannot checkpoint; only runsc sandboxes can be forked: %w", id, b.rec.Runtime, errdefs.ErrFailedPrecondition)
	}
	if err := p.Pause(ctx, id.String()); err != nil {
		return Sandbox{}, nil, fmt.Errorf("freezing sandbox: %w", err)
	}
	defer func() {
		if rerr := p.Resume(context.WithoutCancel(ctx), id.String()); rerr != nil {
			m.log.Error("thawing forked sandbox", "sandbox_id", id, "err", rerr)
			if err == nil {
				err = fmt.Errorf("thawing sandbox %s: %w", id, rerr)
			}
		}
	}()
	if err := ck.Checkpoint(ctx, id.String(), img, true); err != nil {
		return Sandbox{}, nil, fmt.Errorf("checkpointing sandbox: %w", err)
	}
	// Frozen, nothing writes to the layer: flush it and copy its image,
	// which then matches the memory image.
	layer := filepath.Join(b.dir, layerDir)
	if err := rootfs.Sync(layer); err != nil {
		return Sandbox{}, nil, err
	}
	if err := rootfs.CopySparse(disk, rootfs.ImagePath(layer)); err != nil {
		return Sandbox{}, nil, fmt.Errorf("copying layer image: %w", err)
	}
	rec := b.rec
	rec.Env, rec.Metadata = maps.Clone(rec.Env), maps.Clone(rec.Metadata)
	return rec, ck, nil
}

// forkOne makes one fork of src from the checkpoint image img and the
// layer image disk. On failure it unwinds what it made and returns a nil
// box; on success the fork is live and running.
func (m *Manager) forkOne(ctx context.Context, src Sandbox, tmpl *template.Template, ck oci.Checkpointer, img, disk string, q Quota) (_ *box, err error) {
	id := NewID()
	now := time.Now().UTC()
	rec := src
	rec.ID, rec.State, rec.Reason = id, StateCreating, ""
	rec.Env, rec.Metadata = maps.Clone(src.Env), maps.Clone(src.Metadata)
	rec.Node, rec.CreatedAt = m.cfg.Node, now
	rec.Timeout = m.cfg.Limits.DefaultSandboxTimeout
	rec.ExpiresAt, rec.PausedAt = now.Add(rec.Timeout), time.Time{}
	b := &box{dir: filepath.Join(m.cfg.StateDir, id.String()), rec: rec}
	rt := m.runtimes[rec.Runtime]
	log := m.log.With("sandbox_id", id, "fork_of", src.ID)

	var undo []func(context.Context) error
	defer func() {
		if err == nil {
			return
		}
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		for i := len(undo) - 1; i >= 0; i-- {
			if uerr := undo[i](uctx); uerr != nil {
				log.Error("unwinding failed fork", "err", uerr)
			}
		}
		m.mu.Lock()
		delete(m.boxes, id)
		m.mu.Unlock()
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
	layer, err := rootfs.MountImage(ctx, tmpl.Rootfs, filepath.Join(b.dir, layerDir), disk)
	if err != nil {
		return nil, fmt.Errorf("mounting writable layer: %w", err)
	}
	undo = append(undo, func(ctx context.Context) error { return rootfs.Unmount(ctx, layer.Dir()) })
	bundle := &oci.Bundle{Dir: b.dir, Spec: oci.NewSpec(oci.SpecOptions{
		Rootfs:      layer.Rootfs(),
		Args:        []string{agentBinary},
		Env:         m.agentEnv(b.rec),
		Cwd:         "/",
		Hostname:    id.String(),
		Limits:      m.runtimeLimits(rt.Name(), rec.Limits),
		CgroupsPath: cgroupsPath(id),
		AgentDir:    m.agentDir,
	})}
	if err := bundle.Write(); err != nil {
		return nil, err
	}
	undo = append(undo, func(ctx context.Context) error { return deleteContainer(ctx, rt, id, b.dir, b.pids) })
	files, err := openStdio(b.dir)
	if err != nil {
		return nil, err
	}
	err = ck.Restore(ctx, id.String(), bundle, img, oci.IO{Stdin: files[0], Stdout: files[1], Stderr: files[2]})
	for _, f := range files {
		f.Close()
	}
	if err != nil {
		return nil, fmt.Errorf("restoring fork: %w", err)
	}
	if st, err := rt.State(ctx, id.String()); err == nil {
		b.pids = append([]int{st.Pid}, st.HelperPids...)
	}
	cctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	conn, err := connect(cctx, b.dir, false)
	if err != nil {
		return nil, fmt.Errorf("connecting to the forked agent: %w%s", err, agentLogTail(b.dir))
	}
	undo = append(undo, func(context.Context) error { return conn.Close() })
	if err := m.identify(ctx, conn, b.rec); err != nil {
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
