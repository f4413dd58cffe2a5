package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
	imageCapsFile   = "caps.json"   // the source's capability set (a restore needs the same)
)

// keepCaps records the capability set of the sandbox in srcDir with its
// image in imageDir: runsc restores a checkpoint only with the set it was
// made with, and Kiln's set may change between versions.
func keepCaps(srcDir, imageDir string) error {
	b, err := oci.ReadBundle(srcDir)
	if err != nil {
		return err
	}
	data, err := json.Marshal(oci.SpecCapabilities(b.Spec))
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(imageDir, imageCapsFile), data, 0o600); err != nil {
		return fmt.Errorf("recording capabilities: %w", err)
	}
	return nil
}

// imageCaps returns the capability set an image was made with: the one it
// records, or for an image made before images recorded one, the set Kiln
// had then.
func imageCaps(imageDir string) ([]string, error) {
	data, err := os.ReadFile(filepath.Join(imageDir, imageCapsFile))
	if errors.Is(err, os.ErrNotExist) {
		return oci.LegacyCapabilities, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the image's capabilities: %w", err)
	}
	var caps []string
	if err := json.Unmarshal(data, &caps); err != nil || len(caps) == 0 {
		return nil, fmt.Errorf("the image's capabilities are damaged: %w", errdefs.ErrFailedPrecondition)
	}
	return caps, nil
}

// capture freezes a running runsc sandbox, checkpoints it into dir with
// --leave-running and copies its layer image there, then thaws it: the
// sandbox is frozen for about a tenth of a second and keeps running. It
// returns the source's record as of the image. verb names the operation
// in errors ("forked", "snapshotted").
func (m *Manager) capture(ctx context.Context, b *box, dir, verb string) (_ Sandbox, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	id := b.rec.ID
	ck, p, err := m.capturable(b.rec, verb)
	if err != nil {
		return Sandbox{}, err
	}
	if err := p.Pause(ctx, id.String()); err != nil {
		return Sandbox{}, fmt.Errorf("freezing sandbox: %w", err)
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
		return Sandbox{}, fmt.Errorf("checkpointing sandbox: %w", err)
	}
	// Frozen, nothing writes to the layer: flush it and copy its image,
	// which then matches the memory image.
	layer := filepath.Join(b.dir, layerDir)
	if err := rootfs.Sync(layer); err != nil {
		return Sandbox{}, err
	}
	if err := rootfs.CopySparse(filepath.Join(dir, imageDisk), rootfs.ImagePath(layer)); err != nil {
		if errors.Is(err, syscall.ENOSPC) {
			err = fmt.Errorf("%w: %w", err, errdefs.ErrResourceExhausted)
		}
		return Sandbox{}, fmt.Errorf("copying layer image: %w", err)
	}
	if err := keepCaps(b.dir, dir); err != nil {
		return Sandbox{}, err
	}
	if err := keepNetwork(b.dir, dir); err != nil {
		return Sandbox{}, err
	}
	rec := b.rec
	rec.Env, rec.Metadata = maps.Clone(rec.Env), maps.Clone(rec.Metadata)
	return rec, nil
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
// state creating), from the image in dir (see capture) through the
// pipeline's restore path: its own record (admitted against the owner's
// quota q), dir, network if the image's sandbox had one, copy of the
// layer image mounted over tmpl, bundle with its own hostname and cgroup,
// runsc restore, a channel session and its identity (the restored agent
// still has the source's). On failure it unwinds what it made and returns
// a nil box; on success the sandbox is live and running.
func (m *Manager) restoreNew(ctx context.Context, rec Sandbox, tmpl *template.Template, dir string, q Quota) (_ *box, err error) {
	b := &box{dir: filepath.Join(m.cfg.StateDir, rec.ID.String()), rec: rec}
	log := m.log.With("sandbox_id", rec.ID)

	var c cleanup
	defer func() {
		if err != nil {
			if uerr := c.unwind(ctx); uerr != nil {
				log.Error("unwinding failed create", "err", uerr)
			}
		}
	}()
	caps, err := imageCaps(dir)
	if err != nil {
		return nil, err
	}
	if err := m.enroll(ctx, pathRestore, b, &q, &c); err != nil {
		return nil, err
	}
	if err := m.attachRestored(ctx, b, dir, &c); err != nil {
		return nil, err
	}
	conn, err := m.bringUp(ctx, bringup{
		path: pathRestore, b: b, rt: m.runtimes[rec.Runtime], tmpl: tmpl,
		disk: filepath.Join(dir, imageDisk), checkpoint: filepath.Join(dir, imageCheckpoint), identify: true,
		caps: caps,
	}, &c)
	if err != nil {
		return nil, err
	}
	if _, err := m.goLive(ctx, b, conn); err != nil {
		return nil, err
	}
	c.release()
	return b, nil
}

// checkRequest validates a create request's env, metadata and timeout,
// and resolves the timeout.
func (m *Manager) checkRequest(opts CreateOptions) (time.Duration, error) {
	if err := validateRecordVars(opts.Env, opts.Metadata); err != nil {
		return 0, err
	}
	return m.timeout(opts.Timeout)
}
