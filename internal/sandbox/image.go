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
)

// An image of a running sandbox, as Images makes it (capture) and the
// core's pipeline restores it (restoreNew, paths.go): a runsc checkpoint
// and a copy of the writable layer's disk image taken while the sandbox
// was frozen, so the two match, with the source's capability set and
// network state. Forks keep one in a temporary dir, snapshots under the
// snapshot dir. This file is the layout both sides share, and capture.
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
//
// With ahead, the layer image is copied first and ahead is called with
// the record before the checkpoint is taken: it starts, in the background,
// what needs the layer image but not the checkpoint (Fork: its forks'
// layers and containers), to run while the checkpoint is written. The
// checkpoint flushes file data the sentry cached to the layer: if any
// reached it, the copy is taken again and early is false (what ahead made
// does not match the image); early is true when ahead's copy is the
// image's.
func (im *Images) capture(ctx context.Context, b *box, dir, verb string, ahead func(Sandbox)) (_ Sandbox, early bool, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	id := b.rec.ID
	ck, p, err := im.capturable(b.rec, verb)
	if err != nil {
		return Sandbox{}, false, err
	}
	if err := p.Pause(ctx, id.String()); err != nil {
		return Sandbox{}, false, fmt.Errorf("freezing sandbox: %w", err)
	}
	defer func() {
		if rerr := p.Resume(context.WithoutCancel(ctx), id.String()); rerr != nil {
			im.log.Error("thawing sandbox after its image was taken", "sandbox_id", id, "err", rerr)
			if err == nil {
				err = fmt.Errorf("thawing sandbox %s: %w", id, rerr)
			}
		}
	}()
	// Frozen, nothing but the checkpoint writes to the layer.
	layer := filepath.Join(b.dir, layerDir)
	var writes uint64
	if ahead != nil {
		if writes, early, err = copyLayerAhead(layer, dir); err != nil {
			return Sandbox{}, false, err
		}
	}
	if err := keepCaps(b.dir, dir); err != nil {
		return Sandbox{}, false, err
	}
	if err := keepNetwork(b.dir, dir); err != nil {
		return Sandbox{}, false, err
	}
	rec := b.rec
	rec.Env, rec.Metadata = maps.Clone(rec.Env), maps.Clone(rec.Metadata)
	if early {
		ahead(rec)
	}
	if err := ck.Checkpoint(ctx, id.String(), filepath.Join(dir, imageCheckpoint), true); err != nil {
		return Sandbox{}, false, fmt.Errorf("checkpointing sandbox: %w", err)
	}
	if err := rootfs.Sync(layer); err != nil {
		return Sandbox{}, false, err
	}
	if early && !im.layerUnchanged(id, layer, dir, writes) {
		im.log.Info("the layer changed under the checkpoint: copying it again", "sandbox_id", id)
		early = false
		if err := os.Remove(filepath.Join(dir, imageDisk)); err != nil {
			return Sandbox{}, false, fmt.Errorf("removing stale layer copy: %w", err)
		}
	}
	if !early {
		// Flushed after the checkpoint, the copy matches the memory image.
		if err := copyLayer(layer, dir); err != nil {
			return Sandbox{}, false, err
		}
	}
	return rec, early, nil
}

// copyLayerAhead flushes the layer and copies its image into dir before
// the checkpoint, returning the count of writes that had reached it (see
// rootfs.Writes); ok is false, and nothing is copied, when that count
// cannot be read.
func copyLayerAhead(layer, dir string) (writes uint64, ok bool, err error) {
	if err := rootfs.Sync(layer); err != nil {
		return 0, false, err
	}
	if writes, err = rootfs.Writes(layer); err != nil {
		return 0, false, nil
	}
	if err := copyLayer(layer, dir); err != nil {
		return 0, false, err
	}
	return writes, true, nil
}

// layerUnchanged reports whether the flushed layer's image is still the
// copy in dir, which was taken when writes sectors had been written to
// it: none written since, or the same bytes (a write that changed
// nothing, e.g. ext4 writing back metadata as it was).
func (im *Images) layerUnchanged(id ID, layer, dir string, writes uint64) bool {
	n, err := rootfs.Writes(layer)
	if err == nil && n == writes {
		return true
	}
	t0 := time.Now()
	same, serr := rootfs.SameData(rootfs.ImagePath(layer), filepath.Join(dir, imageDisk))
	im.log.Debug("writes reached the layer during the checkpoint", "sandbox_id", id, "sectors", n-writes, "err", err,
		"same_bytes", same, "compare_err", serr, "compare_took", time.Since(t0))
	return serr == nil && same
}

// copyLayer copies the flushed layer image into dir.
func copyLayer(layer, dir string) error {
	if err := rootfs.CopySparse(filepath.Join(dir, imageDisk), rootfs.ImagePath(layer)); err != nil {
		if errors.Is(err, syscall.ENOSPC) {
			err = fmt.Errorf("%w: %w", err, errdefs.ErrResourceExhausted)
		}
		return fmt.Errorf("copying layer image: %w", err)
	}
	return nil
}

// capturable checks that an image of rec can be taken (see capture) and
// returns its runtime's abilities to do so.
func (im *Images) capturable(rec Sandbox, verb string) (oci.Checkpointer, oci.Pauser, error) {
	if rec.State != StateRunning {
		return nil, nil, fmt.Errorf("sandbox %s is %s; only running sandboxes can be %s: %w", rec.ID, rec.State, verb, errdefs.ErrFailedPrecondition)
	}
	if len(rec.Volumes) > 0 {
		return nil, nil, errVolumes(rec.ID, verb)
	}
	rt := im.runtimes[rec.Runtime]
	ck, ok := rt.(oci.Checkpointer)
	p, okp := rt.(oci.Pauser)
	if !ok || !ck.CanCheckpoint() || !okp {
		return nil, nil, fmt.Errorf("sandbox %s runs on %s, which cannot checkpoint; only runsc sandboxes can be %s: %w", rec.ID, rec.Runtime, verb, errdefs.ErrFailedPrecondition)
	}
	return ck, p, nil
}
