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
func (im *Images) capture(ctx context.Context, b *box, dir, verb string) (_ Sandbox, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	id := b.rec.ID
	ck, p, err := im.capturable(b.rec, verb)
	if err != nil {
		return Sandbox{}, err
	}
	if err := p.Pause(ctx, id.String()); err != nil {
		return Sandbox{}, fmt.Errorf("freezing sandbox: %w", err)
	}
	defer func() {
		if rerr := p.Resume(context.WithoutCancel(ctx), id.String()); rerr != nil {
			im.log.Error("thawing sandbox after its image was taken", "sandbox_id", id, "err", rerr)
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
