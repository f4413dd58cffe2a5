package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/oci"
	"github.com/kiln-sh/kiln/internal/rootfs"
)

// adopt reconciles the store with what runs on this node, once, before the
// Manager serves anything: running sandboxes get a new channel session and
// are served again, paused ones kept for a later Resume; records whose sandbox is gone (or was half made when
// the last process died) are marked failed with a reason and their
// leftovers removed; sandbox dirs with no live record are removed.
func (m *Manager) adopt(ctx context.Context) error {
	live := map[ID]bool{}
	for tok := ""; ; {
		recs, next, err := m.store.ListSandboxes(ctx, Filter{
			Node: m.cfg.Node, States: []State{StateCreating, StateRunning, StatePaused, StateStopping},
			Limit: 1000, Token: tok,
		})
		if err != nil {
			return fmt.Errorf("listing sandboxes to adopt: %w", err)
		}
		for _, rec := range recs {
			if m.adoptOne(ctx, rec) {
				live[rec.ID] = true
			}
		}
		if tok = next; tok == "" {
			break
		}
	}
	ents, err := os.ReadDir(m.cfg.StateDir)
	if err != nil {
		return fmt.Errorf("listing sandbox dirs: %w", err)
	}
	// Orphans are removed a few at a time: each costs runtime commands and
	// unmounts (seconds on a loaded host), and a node that comes back from
	// lost may hold dozens whose records the catalog failed meanwhile.
	var wg sync.WaitGroup
	sem := make(chan struct{}, orphanCleanups)
	for _, e := range ents {
		id, err := ParseID(e.Name())
		if err != nil || !e.IsDir() || live[id] {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			m.removeOrphan(ctx, id)
		}()
	}
	wg.Wait()
	return nil
}

// orphanCleanups bounds the orphaned sandbox dirs adopt removes at once.
const orphanCleanups = 4

// removeOrphan removes sandbox dir id, which no record of this node
// names as live.
func (m *Manager) removeOrphan(ctx context.Context, id ID) {
	if rec, err := m.store.GetSandbox(ctx, id); err == nil && rec.Node != m.cfg.Node && !rec.State.Terminal() {
		// Moved to another node from the shared snapshot dir while this
		// one was lost: only its files here are this node's (its
		// container went with its pause; the id's container, if any, is
		// the other node's on a host they share).
		m.log.Info("removing the files of a sandbox moved to another node", "sandbox_id", id, "node", rec.Node)
		m.removeFiles(ctx, id)
		return
	}
	m.log.Warn("removing orphaned sandbox dir", "sandbox_id", id)
	m.cleanup(ctx, id, nil)
}

// adoptOne re-adopts one record's sandbox, or fails it; it reports whether
// the sandbox is live.
func (m *Manager) adoptOne(ctx context.Context, rec Sandbox) bool {
	log := m.log.With("sandbox_id", rec.ID)
	dir := filepath.Join(m.cfg.StateDir, rec.ID.String())
	rt := m.runtimes[rec.Runtime]
	if _, err := os.Stat(dir); rec.State == StatePaused && rec.Image != "" && errors.Is(err, os.ErrNotExist) {
		// Its files are in the shared snapshot dir alone (it was moved
		// here, or this host lost them): its resume restores it from there.
		m.mu.Lock()
		m.boxes[rec.ID] = m.movedBox(rec)
		m.mu.Unlock()
		log.Info("sandbox re-adopted from the shared snapshot dir", "state", rec.State)
		return true
	}
	var err error
	// A paused runsc sandbox's network can be made again (a reboot took
	// it): its restore brings the netstack, as a fork's does.
	ck, _ := rt.(oci.Checkpointer)
	rebuild := rec.State == StatePaused && ck != nil && ck.CanCheckpoint()
	if err = m.adoptNetwork(ctx, rec.ID, dir, rebuild); err != nil {
		err = fmt.Errorf("its network: %w", err)
	} else if rec.State == StatePaused {
		err = m.adoptPaused(ctx, rec, rt, dir)
	} else {
		err = m.reconnect(ctx, rec, rt, dir)
	}
	if err == nil {
		log.Info("sandbox re-adopted", "state", rec.State)
		return true
	}
	reason := "lost while kiln serve was down: " + err.Error()
	if rec.State == StateCreating {
		reason = "kiln serve stopped while creating it"
	}
	log.Warn("failing sandbox that did not survive a restart", "state", rec.State, "reason", reason)
	m.cleanup(ctx, rec.ID, rt)
	rec.State, rec.Reason = StateFailed, m.shortReason(rec.ID, reason)
	if err := m.store.PutSandbox(ctx, rec); err != nil {
		log.Error("recording lost sandbox", "err", err)
	}
	return false
}

// reconnect checks that a running sandbox is still there and opens a new
// channel session to its agent.
func (m *Manager) reconnect(ctx context.Context, rec Sandbox, rt oci.Runtime, dir string) error {
	switch {
	case rt == nil:
		return fmt.Errorf("runtime %q is not configured", rec.Runtime)
	case rec.State != StateRunning:
		return fmt.Errorf("it was %s", rec.State)
	}
	st, err := rt.State(ctx, rec.ID.String())
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return errors.New("its container is gone")
		}
		return err
	}
	if p, ok := rt.(oci.Pauser); ok && st.Status == oci.StatusPaused {
		// Frozen by a pause or fork snapshot that a crash interrupted
		// before the record said so: thaw it.
		if err := p.Resume(ctx, rec.ID.String()); err != nil {
			return fmt.Errorf("thawing its frozen container: %w", err)
		}
		m.log.Warn("thawed a running sandbox left frozen", "sandbox_id", rec.ID)
	} else if st.Status != oci.StatusRunning {
		return fmt.Errorf("its container is %s", st.Status)
	}
	cctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	conn, err := connect(cctx, dir, false)
	if err != nil {
		return err
	}
	b := &box{rec: rec, dir: dir, conn: conn}
	m.mu.Lock()
	m.boxes[rec.ID] = b
	m.mu.Unlock()
	go m.watch(b, conn)
	return nil
}

// cleanup removes whatever a dead or orphaned sandbox left on the host.
func (m *Manager) cleanup(ctx context.Context, id ID, rt oci.Runtime) {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if rt != nil {
		if err := deleteContainer(cctx, rt, id, filepath.Join(m.cfg.StateDir, id.String()), nil); err != nil {
			m.log.Error("deleting container of dead sandbox", "sandbox_id", id, "err", err)
		}
	} else {
		for _, r := range m.runtimes {
			_ = deleteContainer(cctx, r, id, filepath.Join(m.cfg.StateDir, id.String()), nil)
		}
	}
	if err := m.detachNetwork(cctx, id); err != nil {
		m.log.Error("removing network of dead sandbox", "sandbox_id", id, "err", err)
	}
	m.removeFiles(cctx, id)
}

// removeFiles unmounts a dead or orphaned sandbox's layer and removes its
// dir.
func (m *Manager) removeFiles(ctx context.Context, id ID) {
	dir := filepath.Join(m.cfg.StateDir, id.String())
	if err := rootfs.Unmount(ctx, filepath.Join(dir, layerDir)); err != nil {
		m.log.Error("unmounting layer of dead sandbox", "sandbox_id", id, "err", err)
		return
	}
	_ = os.RemoveAll(dir)
}
