package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/oci"
)

// A filesystem-only pause (PauseFiles) and the cold boot that resumes it
// (Reboot, or Resume of such a sandbox). Both are marked by files in the
// sandbox's state dir, so they survive restarts of kiln serve without a
// column in the store:
//
//   - filesOnlyMarker: the sandbox is paused without its memory; its
//     resume boots it afresh on its writable layer.
//   - autoPauseFilesMarker: its timeout pauses it that way (AutoPause with
//     AutoPauseFiles), not with its memory.
const (
	filesOnlyMarker      = "paused-files-only"
	autoPauseFilesMarker = "auto-pause-files-only"
)

// filesOnly reports whether the sandbox in dir is paused without memory.
func filesOnly(dir string) bool { return exists(filepath.Join(dir, filesOnlyMarker)) }

// autoPauseFiles reports whether the sandbox in dir pauses without memory
// at its timeout.
func autoPauseFiles(dir string) bool { return exists(filepath.Join(dir, autoPauseFilesMarker)) }

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// mark creates (on) or removes (off) a marker file in dir.
func mark(dir, name string, on bool) error {
	p := filepath.Join(dir, name)
	if !on {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	return os.WriteFile(p, nil, 0o600)
}

// markAutoPauseFiles makes sandbox id's timeout pause it without its
// memory (see CreateOptions.AutoPauseFiles).
func (m *Manager) markAutoPauseFiles(id ID) error {
	b, err := m.box(id)
	if err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := mark(b.dir, autoPauseFilesMarker, true); err != nil {
		return fmt.Errorf("recording the sandbox's pause without memory: %w", err)
	}
	return nil
}

// pauseFiles stops a running sandbox's processes and deletes its
// container, keeping its writable layer (mounted) and its network; the
// marker written first makes a crash from here on resume by a reboot.
// Callers hold b.mu.
func (m *Manager) pauseFiles(ctx context.Context, b *box, rt oci.Runtime) error {
	if err := mark(b.dir, filesOnlyMarker, true); err != nil {
		return fmt.Errorf("recording the pause: %w", err)
	}
	// The session ends here: the booted agent gets a new one. Clearing
	// b.conn first tells watch that this end is wanted.
	if conn := b.conn; conn != nil {
		b.conn = nil
		conn.Close()
	}
	m.dropContainer(ctx, b, rt, "memoryless paused")
	return nil
}

// Reboot resumes a paused sandbox by booting it afresh on its writable
// layer, whether it was paused with its memory or not: its files are as
// they were, its processes start over (E2B's connect with onResume
// "reboot"). A memory image it had is dropped. If the boot fails the
// sandbox is failed with the reason and destroyed.
//
// Its timeout starts over, as with Resume.
func (m *Manager) Reboot(ctx context.Context, id ID) (Sandbox, error) {
	return m.resume(ctx, id, true)
}

// reboot boots the agent of a sandbox paused without memory on its kept
// writable layer, in its network, as a create boots one: a new bundle
// (runc gets its user pids cgroup again), the container, a fresh session.
// Callers hold b.mu and destroy the sandbox if it fails.
func (m *Manager) reboot(ctx context.Context, b *box) error {
	id := b.rec.ID
	rt := m.runtimes[b.rec.Runtime]
	if rt == nil {
		return fmt.Errorf("runtime %q is not configured: %w", b.rec.Runtime, errdefs.ErrFailedPrecondition)
	}
	if !b.containerGone {
		// Paused with its memory (a checkpointed container left over, or
		// a frozen runc one, thawed so that it can die), or a delete that
		// failed at the pause.
		if p, ok := rt.(oci.Pauser); ok {
			_ = p.Resume(ctx, id.String())
		}
		if b.conn != nil {
			b.conn.Close()
			b.conn = nil
		}
		if err := deleteContainer(ctx, rt, id, b.dir, b.procs.get()); err != nil {
			return fmt.Errorf("deleting the old container: %w", err)
		}
		b.procs = nil
	}
	b.containerGone, b.resumeReady = false, false
	var c cleanup
	pidsCgroup, err := userPids(b, rt, &c)
	if err == nil {
		bundle := m.bundle(b, rt, filepath.Join(b.dir, layerDir, "rootfs"), pidsCgroup, nil)
		if err = bundle.Write(); err == nil {
			err = m.startInPlace(ctx, bringup{path: pathReboot, b: b, rt: rt}, bundle)
		}
	}
	if err != nil {
		_ = c.unwind(ctx)
		return err
	}
	c.release()
	if err := mark(b.dir, filesOnlyMarker, false); err != nil {
		m.log.Warn("removing the pause marker of a rebooted sandbox", "sandbox_id", id, "err", err)
	}
	removeLater(m.log, filepath.Join(b.dir, checkpointDir)) // a memory image it had is stale
	return nil
}
