package server

import (
	"fmt"
	"net/http"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// createSnapshot takes a named snapshot of the caller's running runsc
// sandbox {id}, which keeps running (see sandbox.Images.Snapshot).
func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) error {
	var req api.SnapshotRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	if err := sandbox.ValidSnapshotName(req.Name); err != nil {
		return err
	}
	sb, err := s.lookup(r)
	if err != nil {
		return err
	}
	start := time.Now()
	snap, err := s.im.Snapshot(r.Context(), sb.ID, req.Name)
	s.metrics.ObserveOp("snapshot", time.Since(start), errCode(err))
	if err != nil {
		return fmt.Errorf("snapshotting sandbox: %w", err)
	}
	return writeJSON(w, http.StatusCreated, snapshotToAPI(snap))
}

// listSnapshots lists the caller's snapshots, oldest first, with their
// total size.
func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) error {
	if err := checkQuery(r.URL.Query()); err != nil {
		return err
	}
	snaps, err := s.im.Snapshots(r.Context(), caller(r).ID)
	if err != nil {
		return fmt.Errorf("listing snapshots: %w", err)
	}
	out := api.SnapshotList{Snapshots: make([]api.Snapshot, 0, len(snaps))}
	for _, sn := range snaps {
		out.Snapshots = append(out.Snapshots, snapshotToAPI(sn))
		out.TotalBytes += sn.SizeBytes
	}
	return writeJSON(w, http.StatusOK, out)
}

// getSnapshot returns the caller's snapshot {name}.
func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request) error {
	snap, err := s.im.GetSnapshot(r.Context(), caller(r).ID, r.PathValue("name"))
	if err != nil {
		return fmt.Errorf("getting snapshot: %w", err)
	}
	return writeJSON(w, http.StatusOK, snapshotToAPI(snap))
}

// deleteSnapshot deletes the caller's snapshot {name}; sandboxes made
// from it are not affected.
func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) error {
	if err := s.im.DeleteSnapshot(r.Context(), caller(r).ID, r.PathValue("name")); err != nil {
		return fmt.Errorf("deleting snapshot: %w", err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func snapshotToAPI(sn sandbox.Snapshot) api.Snapshot {
	l := sn.Limits
	return api.Snapshot{
		ID: sn.ID, Name: sn.Name, Source: sn.Source.String(), Template: sn.Template, Runtime: sn.Runtime,
		Limits:    api.Limits{CPUs: l.CPUs, MemoryBytes: l.MemoryBytes, DiskBytes: l.DiskBytes, Pids: l.Pids},
		SizeBytes: sn.SizeBytes, CreatedAt: sn.CreatedAt,
	}
}
