package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/kiln-sh/kiln/internal/oci"
	"github.com/kiln-sh/kiln/internal/rootfs"
)

// adopt reconnects to the sandboxes a previous kiln serve left running and
// cleans up the ones that died or were half made. It runs once, before the
// Manager serves anything.
func (m *Manager) adopt(ctx context.Context) {
	ents, err := os.ReadDir(m.cfg.StateDir)
	if err != nil {
		m.log.Error("listing sandboxes to adopt", "err", err)
		return
	}
	for _, e := range ents {
		id, err := ParseID(e.Name())
		if err != nil || !e.IsDir() {
			continue
		}
		dir := filepath.Join(m.cfg.StateDir, e.Name())
		log := m.log.With("sandbox_id", id)
		rec, rt, err := m.readRecord(dir)
		if err == nil && rt == nil {
			err = fmt.Errorf("runtime %q is not configured", rec.Runtime)
		}
		if err == nil && rec.State == StateRunning {
			var st oci.State
			if st, err = rt.State(ctx, id.String()); err == nil && st.Status == oci.StatusRunning {
				cctx, cancel := context.WithTimeout(ctx, connectTimeout)
				conn, cerr := connect(cctx, dir)
				cancel()
				if cerr == nil {
					b := &box{rec: rec, dir: dir, conn: conn}
					m.mu.Lock()
					m.boxes[id] = b
					m.mu.Unlock()
					go m.watch(b, conn)
					log.Info("sandbox re-adopted")
					continue
				}
				err = cerr
			}
		}
		log.Warn("cleaning up sandbox that did not survive", "state", rec.State, "err", err)
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		if rt != nil {
			_ = deleteContainer(cctx, rt, id, 0)
		}
		if err := rootfs.Unmount(cctx, filepath.Join(dir, layerDir)); err != nil {
			log.Error("unmounting layer of dead sandbox", "err", err)
		} else {
			_ = os.RemoveAll(dir)
		}
		cancel()
	}
}

func (m *Manager) readRecord(dir string) (Sandbox, oci.Runtime, error) {
	var rec Sandbox
	b, err := os.ReadFile(filepath.Join(dir, recordFile))
	if err != nil {
		return rec, nil, err
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, nil, err
	}
	return rec, m.runtimes[rec.Runtime], nil
}
