package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/oci"
	"github.com/kiln-sh/kiln/internal/rootfs"
)

// Paused sandboxes across nodes. With a shared snapshot dir (shared.go)
// a runsc sandbox's pause writes its image there, and its record names
// it (Sandbox.Image). Its node resumes it from that image on its own
// layer, as without one. When its node is lost, a front moves the record
// to another node (cluster.Store.MoveSandbox); that node takes the
// sandbox over on the first request about it (claim) and its resume
// restores it from the shared image alone (restoreMoved): a copy of the
// disk image, the memory image, and a new session.

// shared is the shared snapshot dir ("" for none).
func (m *Manager) shared() string { return m.cfg.Cluster.SnapshotDir }

// claim returns sandbox id's box; a paused sandbox that this node does
// not hold but whose record names it, with a shared image (a front moved
// it here, or this node restarted without its files), is taken over
// first, as a box with no files on this host yet (moved).
func (m *Manager) claim(ctx context.Context, id ID) (*box, error) {
	b, err := m.box(id)
	if err == nil || !errors.Is(err, errdefs.ErrNotFound) {
		return b, err
	}
	rec, gerr := m.store.GetSandbox(ctx, id)
	if gerr != nil || rec.Node != m.cfg.Node || rec.State != StatePaused || rec.Image == "" {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if b, ok := m.boxes[id]; ok {
		return b, nil
	}
	b = m.movedBox(rec)
	m.boxes[id] = b
	m.log.Info("took over a paused sandbox from the shared snapshot dir", "sandbox_id", id)
	return b, nil
}

// movedBox is the box of a paused sandbox whose files are in the shared
// snapshot dir only.
func (m *Manager) movedBox(rec Sandbox) *box {
	return &box{rec: rec, dir: filepath.Join(m.cfg.StateDir, rec.ID.String()), containerGone: true, moved: true}
}

// stillOurs checks, before a paused sandbox with a shared image is
// resumed here, that its record still names this node: a front may have
// moved it to another while this node was lost (cut off, not dead), and
// two nodes must never run it. Callers hold b.mu.
func (m *Manager) stillOurs(ctx context.Context, b *box) error {
	if b.rec.Image == "" {
		return nil
	}
	rec, err := m.store.GetSandbox(ctx, b.rec.ID)
	if err != nil {
		return fmt.Errorf("reading the record of sandbox %s: %w", b.rec.ID, err)
	}
	if rec.Node != m.cfg.Node {
		return fmt.Errorf("sandbox %s was moved to node %s: %w", b.rec.ID, rec.Node, errdefs.ErrNotFound)
	}
	return nil
}

// checkpointShared is the shared dir's part of a runsc pause: with the
// container frozen and checkpointed into tmp's checkpoint dir, it copies
// the layer's disk image there with the capabilities and network state
// (as capture does), and seals the image into the shared dir. It returns
// the image's reference for the record. Callers hold b.mu.
func (m *Manager) checkpointShared(b *box, tmp string) (string, error) {
	layer := filepath.Join(b.dir, layerDir)
	if err := rootfs.Sync(layer); err != nil {
		return "", err
	}
	if err := rootfs.CopySparse(filepath.Join(tmp, imageDisk), rootfs.ImagePath(layer)); err != nil {
		if errors.Is(err, syscall.ENOSPC) {
			err = fmt.Errorf("%w: %w", err, errdefs.ErrResourceExhausted)
		}
		return "", fmt.Errorf("copying layer image to the shared snapshot dir: %w", err)
	}
	if err := keepCaps(b.dir, tmp); err != nil {
		return "", err
	}
	if err := keepNetwork(b.dir, tmp); err != nil {
		return "", err
	}
	return sealImage(tmp, m.shared(), pausedImagePath(b.rec.ID))
}

// restoreMoved brings a moved sandbox (its files in the shared snapshot
// dir only) up on this node, as it was when it was paused: its image
// checked against its record, a dir, its network if it had one, a copy
// of its disk image, its memory image restored, a new session. On
// failure it unwinds what it made. Callers hold b.mu.
func (m *Manager) restoreMoved(ctx context.Context, b *box) (err error) {
	t0 := time.Now()
	img, err := openImage(m.shared(), b.rec.Image, imageBound(b.rec.Limits), true)
	if err != nil {
		return err
	}
	t1 := time.Now()
	rt := m.runtimes[b.rec.Runtime]
	if ck, ok := rt.(oci.Checkpointer); !ok || !ck.CanCheckpoint() {
		return fmt.Errorf("runtime %s cannot restore it on this node: %w", b.rec.Runtime, errdefs.ErrFailedPrecondition)
	}
	tmpl, err := m.cfg.templateOf(b.rec.Template, b.rec.Build)
	if err != nil {
		return fmt.Errorf("its template %s: %w: %w", b.rec.Template, errdefs.ErrFailedPrecondition, err)
	}
	caps, err := imageCaps(img)
	if err != nil {
		return err
	}
	var c cleanup
	defer func() {
		if err != nil {
			if uerr := c.unwind(context.WithoutCancel(ctx)); uerr != nil {
				m.log.Error("unwinding a failed restore from the shared snapshot dir", "sandbox_id", b.rec.ID, "err", uerr)
			}
		}
	}()
	if err := os.Mkdir(b.dir, 0o700); err != nil {
		return fmt.Errorf("creating sandbox dir: %w", err)
	}
	c.add(func(context.Context) error { return os.RemoveAll(b.dir) })
	if err := m.attachRestored(ctx, b, img, &c); err != nil {
		return err
	}
	conn, err := m.bringUp(ctx, bringup{
		path: pathMove, b: b, rt: rt, tmpl: tmpl, caps: caps,
		disk: filepath.Join(img, imageDisk), checkpoint: filepath.Join(img, imageCheckpoint),
	}, &c)
	if err != nil {
		return err
	}
	c.release()
	b.conn, b.moved, b.containerGone = conn, false, false
	go m.watch(b, conn)
	m.log.Info("restored a paused sandbox from the shared snapshot dir", "sandbox_id", b.rec.ID,
		"verify", t1.Sub(t0), "total", time.Since(t0))
	return nil
}

// dropImage removes b's shared image, once nothing needs it (resumed,
// ended), and forgets it in b's record (persisted by the caller's next
// transition). Callers hold b.mu.
func (m *Manager) dropImage(b *box) {
	if b.rec.Image == "" {
		return
	}
	if dir := imageDir(m.shared(), b.rec.Image); dir != "" {
		removeLater(m.log, dir)
	}
	b.rec.Image = ""
}

// Disown drops sandbox id from this node without ending it: its record
// names another node now (a front moved it while this node was lost), so
// its record and shared image are that node's. What it left on this host
// (a paused sandbox's layer and dir) is removed.
func (m *Manager) Disown(ctx context.Context, id ID) error {
	b, err := m.box(id)
	if err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ending.Store(true)
	if b.conn != nil {
		b.conn.Close()
		b.conn = nil
	}
	var errs []error
	if !b.moved {
		// A paused runsc sandbox's container went with its pause (unless
		// its delete failed); a container of that id whose bundle is not
		// this dir is the other node's, on a host they share.
		if rt := m.runtimes[b.rec.Runtime]; rt != nil {
			if st, err := rt.State(ctx, id.String()); err == nil && filepath.Clean(st.Bundle) == filepath.Clean(b.dir) {
				errs = append(errs, deleteContainer(ctx, rt, id, b.dir, b.procs.get()))
			}
		}
		errs = append(errs, rootfs.Unmount(ctx, filepath.Join(b.dir, layerDir)), m.detachNetwork(ctx, id))
		if err := errors.Join(errs...); err != nil {
			return fmt.Errorf("removing sandbox %s from this node: %w", id, err)
		}
		if err := os.RemoveAll(b.dir); err != nil {
			return fmt.Errorf("removing sandbox dir: %w", err)
		}
	}
	m.forget(id)
	m.log.Info("sandbox moved to another node; removed here", "sandbox_id", id)
	return nil
}
