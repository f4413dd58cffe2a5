package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/oci"
	"github.com/kiln-sh/kiln/internal/rootfs"
)

// checkpointDir is the checkpoint image of a paused sandbox, in its state
// dir; checkpointImage is the file that must be there for a resume.
const (
	checkpointDir   = "checkpoint"
	checkpointImage = "checkpoint.img"
)

// Pause pauses a running sandbox.
//
// On runsc the sandbox is checkpointed: its memory, processes and kernel
// state go to an image in its state dir, and its container is destroyed,
// so a paused sandbox holds no memory or CPU. Its writable layer stays
// mounted on the host, so its files stay as they are. A paused runsc
// sandbox survives restarts of kiln serve. If the checkpoint fails (e.g.
// the disk is full) the sandbox keeps running and Pause returns the error.
//
// On runc (no checkpoint) the container is frozen: its processes stop
// being scheduled, but their memory stays allocated.
//
// A paused sandbox's timeout stops; it is deleted once it has been paused
// for the server's MaxPausedLifetime (its ExpiresAt says when), unless it
// is resumed or killed first.
//
// PauseFiles pauses keeping only the files (see pauseFiles).
func (m *Manager) Pause(ctx context.Context, id ID) (Sandbox, error) {
	return m.pause(ctx, id, true)
}

// PauseFiles pauses a running sandbox keeping its files but not its
// memory, on either runtime: its processes are stopped and its container
// deleted, its writable layer stays. Its resume boots it afresh on that
// layer (see Reboot): the files are as they were, processes start over.
// It holds no memory or CPU while paused, and survives restarts of kiln
// serve.
func (m *Manager) PauseFiles(ctx context.Context, id ID) (Sandbox, error) {
	return m.pause(ctx, id, false)
}

func (m *Manager) pause(ctx context.Context, id ID, keepMemory bool) (Sandbox, error) {
	b, err := m.box(id)
	if err != nil {
		return Sandbox{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return m.pauseLocked(ctx, b, keepMemory)
}

// pauseLocked is Pause (keepMemory) or PauseFiles for a caller holding
// b.mu.
func (m *Manager) pauseLocked(ctx context.Context, b *box, keepMemory bool) (_ Sandbox, err error) {
	id := b.rec.ID
	if b.rec.State != StateRunning {
		return Sandbox{}, fmt.Errorf("sandbox %s is %s: %w", id, b.rec.State, errdefs.ErrFailedPrecondition)
	}
	if len(b.rec.Volumes) > 0 {
		return Sandbox{}, errVolumes(id, "paused")
	}
	rt := m.runtimes[b.rec.Runtime]
	t0 := time.Now()
	if !keepMemory {
		err = m.pauseFiles(ctx, b, rt)
	} else if ck, ok := rt.(oci.Checkpointer); ok && ck.CanCheckpoint() {
		err = m.checkpoint(ctx, b, rt, ck)
	} else if p, ok := rt.(oci.Pauser); ok {
		if err = p.Pause(ctx, id.String()); err != nil {
			err = fmt.Errorf("freezing sandbox: %w", err)
		}
	} else {
		err = fmt.Errorf("runtime %s cannot pause: %w", rt.Name(), errdefs.ErrFailedPrecondition)
	}
	if err != nil {
		return Sandbox{}, err
	}
	now := time.Now().UTC()
	b.rec.PausedAt, b.rec.ExpiresAt = now, time.Time{}
	if l := m.cfg.Limits.MaxPausedLifetime; l > 0 {
		b.rec.ExpiresAt = now.Add(l)
	}
	if err := m.transition(ctx, b, StatePaused, ""); err != nil {
		return Sandbox{}, err
	}
	m.log.Info("sandbox paused", "sandbox_id", id, "memory", keepMemory, "took", time.Since(t0))
	if keepMemory && m.cfg.ResumeReady && b.containerGone && b.rec.Image == "" {
		go m.makeResumeReady(b)
	}
	return b.rec, nil
}

// makeResumeReady creates the container of checkpointed sandbox b again
// from its bundle, not started (Config.ResumeReady): its resume then
// restores into it (runsc skips the sandbox and gofer spawn). It runs
// after the pause returned, under b.mu; a resume that comes first takes
// the usual way. A failure is logged and leaves b as the pause did.
func (m *Manager) makeResumeReady(b *box) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.rec.State != StatePaused || !b.containerGone || b.ending.Load() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rt := m.runtimes[b.rec.Runtime]
	bundle, err := oci.ReadBundle(b.dir)
	if err == nil {
		err = m.createContainer(ctx, rt, b.rec.ID, bundle)
	}
	if err != nil {
		m.log.Warn("creating a paused sandbox's container ahead of its resume", "sandbox_id", b.rec.ID, "err", err)
		return
	}
	b.containerGone, b.resumeReady = false, true
	b.procs = learnProcs(rt, b.rec.ID.String())
}

// checkpoint saves a runsc sandbox to its image dir and destroys its
// container. The container is frozen first and checkpointed with
// --leave-running, so that nothing changes the layer between the image
// and the container's end, and a failed checkpoint leaves it running.
// Callers hold b.mu.
//
// With a shared snapshot dir the image goes there instead, with a copy
// of the layer's disk image (checkpointShared), and b's record names it:
// another node can then resume the sandbox if this one is lost.
func (m *Manager) checkpoint(ctx context.Context, b *box, rt oci.Runtime, ck oci.Checkpointer) error {
	id := b.rec.ID.String()
	img := filepath.Join(b.dir, checkpointDir)
	if err := clearDir(img); err != nil {
		return fmt.Errorf("clearing checkpoint dir: %w", err)
	}
	tmp := ""
	if m.shared() != "" {
		var err error
		if tmp, err = newSharedTemp(m.shared(), m.cfg.Node); err != nil {
			return err
		}
		defer os.RemoveAll(tmp) // gone once sealed (renamed)
		img = filepath.Join(tmp, imageCheckpoint)
	}
	p, ok := rt.(oci.Pauser)
	if !ok {
		return fmt.Errorf("runtime %s cannot freeze: %w", rt.Name(), errdefs.ErrFailedPrecondition)
	}
	// The session ends here: the restored agent gets a new one. Clearing
	// b.conn first tells watch that this end is wanted.
	conn := b.conn
	b.conn = nil
	if conn != nil {
		conn.Close()
	}
	undo := func(cause error) error {
		_ = clearDir(img)
		if err := p.Resume(context.WithoutCancel(ctx), id); err != nil {
			return fmt.Errorf("%w (and thawing it again: %v)", cause, err)
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), connectTimeout)
		defer cancel()
		conn, err := connect(cctx, b.dir, false)
		if err != nil {
			return fmt.Errorf("%w (and reconnecting to its agent: %v)", cause, err)
		}
		b.conn = conn
		go m.watch(b, conn)
		return cause
	}
	if err := p.Pause(ctx, id); err != nil {
		return undo(fmt.Errorf("freezing sandbox: %w", err))
	}
	if err := ck.Checkpoint(ctx, id, img, true); err != nil {
		return undo(fmt.Errorf("checkpointing sandbox: %w", err))
	}
	if tmp != "" {
		ref, err := m.checkpointShared(b, tmp)
		if err != nil {
			return undo(err)
		}
		b.rec.Image = ref // recorded with the pause
	}
	// The image is not fsynced: a restart of kiln serve keeps the page
	// cache, and so does a clean reboot of the host (which flushes it;
	// adopt then mounts the layer again). Only a power loss right after a
	// pause loses it, and an fsync would add its time (about a second per
	// GiB here) to every pause. A shared image is flushed (sealImage):
	// another machine reads it, perhaps after this one lost power.
	// The image is complete; if the delete fails the container is half
	// gone, and Resume can still restore from the image once it is
	// deleted.
	m.dropContainer(ctx, b, rt, "checkpointed")
	return nil
}

// dropContainer deletes the container of a sandbox being paused (how:
// "checkpointed", ...); a failure is logged and left to the resume, which
// deletes what is left first. Callers hold b.mu.
func (m *Manager) dropContainer(ctx context.Context, b *box, rt oci.Runtime, how string) {
	b.containerGone = false
	if err := deleteContainer(context.WithoutCancel(ctx), rt, b.rec.ID, b.dir, b.procs.get()); err != nil {
		m.log.Error("deleting the container of a "+how+" sandbox", "sandbox_id", b.rec.ID, "err", err)
	} else {
		b.containerGone = true
	}
	b.procs = nil
}

// Resume resumes a paused sandbox. A runsc sandbox is restored from its
// checkpoint image, with its processes, their memory and its files as
// they were, and gets a new agent session; if that fails (e.g. its image
// is missing or corrupt) the sandbox is failed with the reason and
// destroyed. A runc sandbox is thawed.
//
// A sandbox paused without its memory (PauseFiles) is booted afresh on
// its files instead (see Reboot).
//
// Its timeout starts over: it expires its Timeout from now.
func (m *Manager) Resume(ctx context.Context, id ID) (Sandbox, error) {
	return m.resume(ctx, id, false)
}

func (m *Manager) resume(ctx context.Context, id ID, reboot bool) (Sandbox, error) {
	b, err := m.claim(ctx, id)
	if err != nil {
		return Sandbox{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return m.resumeLocked(ctx, b, reboot)
}

// Wake resumes a paused sandbox that has AutoResume, as any use of it
// does; other sandboxes are returned as they are. Concurrent callers wait
// for one resume.
func (m *Manager) Wake(ctx context.Context, id ID) (Sandbox, error) {
	b, err := m.claim(ctx, id)
	if err != nil {
		return m.store.GetSandbox(ctx, id)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.rec.State != StatePaused || !b.rec.AutoResume {
		return b.rec, nil
	}
	return m.resumeLocked(ctx, b, false)
}

// resumeLocked is Resume (or with reboot, Reboot) for a caller holding
// b.mu.
func (m *Manager) resumeLocked(ctx context.Context, b *box, reboot bool) (Sandbox, error) {
	id := b.rec.ID
	if b.rec.State != StatePaused {
		return Sandbox{}, fmt.Errorf("sandbox %s is %s: %w", id, b.rec.State, errdefs.ErrFailedPrecondition)
	}
	if err := m.stillOurs(ctx, b); err != nil {
		return Sandbox{}, err
	}
	if reboot && !b.moved { // a moved one has its memory image only: restored with it
		if err := mark(b.dir, filesOnlyMarker, true); err != nil {
			return Sandbox{}, fmt.Errorf("recording the reboot: %w", err)
		}
	}
	rt := m.runtimes[b.rec.Runtime]
	t0 := time.Now()
	if b.moved {
		if err := m.restoreMoved(ctx, b); err != nil {
			if m.shared() == "" { // a node without the dir: it stays paused
				return Sandbox{}, fmt.Errorf("resuming sandbox %s: %w", id, err)
			}
			reason := "resuming: " + err.Error()
			if derr := m.destroyLocked(context.WithoutCancel(ctx), b, StateFailed, reason); derr != nil {
				m.log.Error("cleaning up sandbox that failed to resume", "sandbox_id", id, "err", derr)
			}
			return Sandbox{}, fmt.Errorf("resuming sandbox %s: %w", id, err)
		}
	} else if filesOnly(b.dir) {
		if err := m.reboot(ctx, b); err != nil {
			reason := "resuming: " + err.Error()
			if derr := m.destroyLocked(context.WithoutCancel(ctx), b, StateFailed, reason); derr != nil {
				m.log.Error("cleaning up sandbox that failed to resume", "sandbox_id", id, "err", derr)
			}
			return Sandbox{}, fmt.Errorf("resuming sandbox %s: %w", id, err)
		}
	} else if ck, ok := rt.(oci.Checkpointer); ok && ck.CanCheckpoint() {
		if err := m.restore(ctx, b); err != nil {
			reason := "resuming: " + err.Error()
			if derr := m.destroyLocked(context.WithoutCancel(ctx), b, StateFailed, reason); derr != nil {
				m.log.Error("cleaning up sandbox that failed to resume", "sandbox_id", id, "err", derr)
			}
			return Sandbox{}, fmt.Errorf("resuming sandbox %s: %w", id, err)
		}
	} else if p, ok := rt.(oci.Pauser); ok {
		if err := p.Resume(ctx, id.String()); err != nil {
			return Sandbox{}, fmt.Errorf("thawing sandbox: %w", err)
		}
		if b.conn == nil { // adopted while frozen: no session yet
			cctx, cancel := context.WithTimeout(ctx, connectTimeout)
			defer cancel()
			conn, err := connect(cctx, b.dir, false)
			if err != nil {
				return Sandbox{}, fmt.Errorf("connecting to the thawed agent: %w", err)
			}
			b.conn = conn
			go m.watch(b, conn)
		}
	} else {
		return Sandbox{}, fmt.Errorf("runtime %s cannot resume: %w", b.rec.Runtime, errdefs.ErrFailedPrecondition)
	}
	timeout := b.rec.Timeout
	if timeout <= 0 {
		timeout = m.cfg.Limits.DefaultSandboxTimeout
	}
	now := time.Now().UTC()
	b.rec.ExpiresAt, b.rec.PausedAt = now.Add(timeout), time.Time{}
	m.dropImage(b) // running: its image is stale
	if err := m.transition(ctx, b, StateRunning, ""); err != nil {
		return Sandbox{}, err
	}
	m.log.Info("sandbox resumed", "sandbox_id", id, "took", time.Since(t0))
	return b.rec, nil
}

// restore brings a checkpointed runsc sandbox back on its agent FIFOs and
// opens a new channel session. Callers hold b.mu.
func (m *Manager) restore(ctx context.Context, b *box) error {
	id := b.rec.ID.String()
	img := filepath.Join(b.dir, checkpointDir)
	if b.rec.Image != "" {
		// Written by this node (its layer is here): sizes and manifest
		// are checked, not every byte.
		dir, err := openImage(m.shared(), b.rec.Image, imageBound(b.rec.Limits), false)
		if err != nil {
			return err
		}
		img = filepath.Join(dir, imageCheckpoint)
	}
	if _, err := os.Stat(filepath.Join(img, checkpointImage)); err != nil {
		return fmt.Errorf("its checkpoint image is missing: %w", errdefs.ErrFailedPrecondition)
	}
	bundle, err := oci.ReadBundle(b.dir)
	if err != nil {
		return err
	}
	rt := m.runtimes[b.rec.Runtime]
	// A container left over by a checkpoint whose delete failed, or
	// unknown (adopted after a restart); not one made to resume into.
	ready := b.resumeReady
	if !b.containerGone && !ready {
		if err := rt.Delete(ctx, id, true); err != nil {
			return fmt.Errorf("deleting the checkpointed container: %w", err)
		}
	}
	b.containerGone, b.resumeReady = false, false
	if err := m.readdressNetwork(ctx, b.rec.ID); err != nil {
		return err
	}
	if err := m.startInPlace(ctx, bringup{path: pathResume, b: b, rt: rt, checkpoint: img, created: ready}, bundle); err != nil {
		return err
	}
	if b.rec.Image == "" {
		removeLater(m.log, img) // stale from now on (a shared one: dropImage)
	}
	return nil
}

// startInPlace runs the pipeline's last stages for a paused sandbox
// brought back in place (its dir, layer and bundle are there), a booted
// agent's DNS included, and gives it the new session. On failure the
// caller destroys the sandbox with its container. Callers hold u.b.mu.
func (m *Manager) startInPlace(ctx context.Context, u bringup, bundle *oci.Bundle) error {
	var c cleanup
	conn, err := m.startAgent(ctx, u, bundle, &c)
	if err == nil && u.checkpoint == "" {
		err = m.configureDNS(ctx, u.b.rec.ID, conn)
	}
	if err != nil {
		_ = c.unwind(ctx)
		return err
	}
	c.release()
	u.b.conn = conn
	go m.watch(u.b, conn)
	return nil
}

// removeLater removes a checkpoint image (or a dir holding one) in the
// background: removing a large file takes about 0.8 s per GiB on these
// hosts, which no resume or fork should wait for. The dir is renamed first,
// so its path is free at once; a crash leaves the renamed dir where the
// sandbox's destroy (or, for a fork's, adopt) removes it.
func removeLater(log *slog.Logger, dir string) {
	stale := dir + ".stale-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if err := os.Rename(dir, stale); err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			_ = os.RemoveAll(dir)
		}
		return
	}
	go func() {
		if err := os.RemoveAll(stale); err != nil {
			log.Warn("removing a stale checkpoint image", "dir", stale, "err", err)
		}
	}()
}

// procs are the runtime's host processes of a container this process
// started or restored, for reaping them at its destroy. They are learnt in
// the background: runsc state takes 50-70 ms here, which no create or
// resume should wait for.
type procs struct {
	done chan struct{}
	pids []int
}

// learnProcs asks the runtime for container id's host processes.
func learnProcs(rt oci.Runtime, id string) *procs {
	p := &procs{done: make(chan struct{})}
	go func() {
		defer close(p.done)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if cli, ok := rt.(*oci.CLI); ok {
			p.pids, _ = cli.Pids(ctx, id) // runsc: its state file, no command
		} else if st, err := rt.State(ctx, id); err == nil {
			p.pids = append([]int{st.Pid}, st.HelperPids...)
		}
	}()
	return p
}

// get returns the processes once they are known; nil if they are unknown
// (p is nil, or the runtime could not say).
func (p *procs) get() []int {
	if p == nil {
		return nil
	}
	<-p.done
	return p.pids
}

// openStdio opens the agent's FIFOs read-write (creating them if they are
// gone) and its log, as stdio for a restored container; see start.
func openStdio(dir string) ([]*os.File, error) {
	var files []*os.File
	fail := func(err error) ([]*os.File, error) {
		for _, f := range files {
			f.Close()
		}
		return nil, err
	}
	for _, name := range []string{stdinFIFO, stdoutFIFO} {
		p := filepath.Join(dir, name)
		if err := syscall.Mkfifo(p, 0o600); err != nil && !errors.Is(err, os.ErrExist) {
			return fail(fmt.Errorf("creating agent fifo: %w", err))
		}
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if err != nil {
			return fail(fmt.Errorf("opening agent fifo: %w", err))
		}
		files = append(files, f)
	}
	logf, err := os.OpenFile(filepath.Join(dir, agentLog), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fail(fmt.Errorf("opening agent log: %w", err))
	}
	return append(files, logf), nil
}

// adoptPaused takes back a sandbox paused by an earlier process: a runsc
// one needs its checkpoint image and its mounted layer, a runc one a
// container that is still frozen. It gets a session on Resume.
func (m *Manager) adoptPaused(ctx context.Context, rec Sandbox, rt oci.Runtime, dir string) error {
	if rt == nil {
		return fmt.Errorf("runtime %q is not configured", rec.Runtime)
	}
	files := filesOnly(dir)
	ck, ok := rt.(oci.Checkpointer)
	if files || (ok && ck.CanCheckpoint()) {
		// An image in the shared snapshot dir is checked at the resume.
		if _, err := os.Stat(filepath.Join(dir, checkpointDir, checkpointImage)); err != nil && !files && rec.Image == "" {
			return errors.New("its checkpoint image is gone")
		}
		if !mounted(filepath.Join(dir, layerDir, "rootfs")) {
			// The host rebooted: its files are there, its mounts are not.
			if _, err := rootfs.Remount(filepath.Join(dir, layerDir)); err != nil {
				return fmt.Errorf("its writable layer is no longer mounted, and mounting it again failed: %w", err)
			}
			m.log.Warn("mounted the writable layer of a paused sandbox again (the host rebooted?)", "sandbox_id", rec.ID)
		}
	} else {
		st, err := rt.State(ctx, rec.ID.String())
		if err != nil {
			return fmt.Errorf("its container is gone: %w", err)
		}
		if st.Status != oci.StatusPaused {
			return fmt.Errorf("its container is %s", st.Status)
		}
	}
	if rec.PausedAt.IsZero() {
		// Paused by a kiln from before paused sandboxes were reclaimed:
		// its time to live starts now.
		rec.PausedAt, rec.ExpiresAt = time.Now().UTC(), time.Time{}
		if l := m.cfg.Limits.MaxPausedLifetime; l > 0 {
			rec.ExpiresAt = rec.PausedAt.Add(l)
		}
		if err := m.store.PutSandbox(ctx, rec); err != nil {
			return fmt.Errorf("recording its paused lifetime: %w", err)
		}
	}
	m.mu.Lock()
	m.boxes[rec.ID] = &box{rec: rec, dir: dir, containerGone: files}
	m.mu.Unlock()
	return nil
}

// mounted reports whether path is a mount point (on another device than
// its parent).
func mounted(path string) bool {
	var a, b syscall.Stat_t
	if syscall.Stat(path, &a) != nil || syscall.Stat(filepath.Dir(path), &b) != nil {
		return false
	}
	return a.Dev != b.Dev
}

// clearDir removes what dir holds, keeping dir (which may be a mount
// point); a missing dir is fine.
func clearDir(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}
