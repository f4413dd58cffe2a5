package e2b

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// E2B's snapshots are Kiln's named snapshots (sandbox.Images.Snapshot):
// the snapshot's name is its snapshotID, which Sandbox.create takes as a
// templateID and Sandbox.deleteSnapshot deletes as a template.

type snapshotRequest struct {
	Name string `json:"name"`
}

// snapshotInfo is E2B's SnapshotInfo.
type snapshotInfo struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

func toSnapshotInfo(s sandbox.Snapshot) snapshotInfo {
	return snapshotInfo{SnapshotID: s.Name, Names: []string{s.Name}}
}

// createSnapshot is POST /sandboxes/{id}/snapshots: a snapshot of the
// running sandbox, which keeps running (gVisor only).
func (h *Handler) createSnapshot(w http.ResponseWriter, r *http.Request, c Caller) error {
	var req snapshotRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	sb, err := h.lookup(r, c)
	if err != nil {
		return err
	}
	if req.Name == "" {
		req.Name = "snapshot-" + sandbox.NewID().String()
	}
	snap, err := h.im.Snapshot(r.Context(), sb.ID, req.Name)
	if err != nil {
		return fmt.Errorf("taking snapshot: %w", err)
	}
	writeJSON(w, http.StatusCreated, toSnapshotInfo(snap))
	return nil
}

// listSnapshots is GET /snapshots?sandboxID=&name=&limit=&nextToken=,
// newest first.
func (h *Handler) listSnapshots(w http.ResponseWriter, r *http.Request, c Caller) error {
	q := r.URL.Query()
	limit, err := pageLimit(q.Get("limit"))
	if err != nil {
		return err
	}
	snaps, err := h.im.Snapshots(r.Context(), c.Owner)
	if err != nil {
		return fmt.Errorf("listing snapshots: %w", err)
	}
	var out []sandbox.Snapshot
	for _, s := range snaps {
		if (q.Get("sandboxID") == "" || s.Source.String() == q.Get("sandboxID")) && (q.Get("name") == "" || s.Name == q.Get("name")) {
			out = append(out, s)
		}
	}
	key := func(s sandbox.Snapshot) (time.Time, string) { return s.CreatedAt, s.ID }
	page, next, err := paginate(out, key, true, q.Get("nextToken"), limit)
	if err != nil {
		return err
	}
	infos := make([]snapshotInfo, 0, len(page))
	for _, s := range page {
		infos = append(infos, toSnapshotInfo(s))
	}
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	writeJSON(w, http.StatusOK, infos)
	return nil
}

// deleteTemplate is DELETE /templates/{id}, which the SDK's
// deleteSnapshot calls too: it deletes the caller's snapshot of that
// name, else its template of that name (templates_manage.go).
func (h *Handler) deleteTemplate(w http.ResponseWriter, r *http.Request, c Caller) error {
	name := r.PathValue("id")
	err := h.im.DeleteSnapshot(r.Context(), c.Owner, name)
	switch {
	case errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrInvalidArgument):
		err = errdefs.ErrNotFound
		if h.templatesOn() == nil {
			err = h.deleteCustomTemplate(r, c, name)
		}
		if errors.Is(err, errdefs.ErrNotFound) {
			return fmt.Errorf("template or snapshot '%s' not found: %w", errdefs.ClipN(name, 64), errdefs.ErrNotFound)
		}
		if err != nil {
			return err
		}
	case err != nil:
		return fmt.Errorf("deleting snapshot: %w", err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// fromSnapshot sets opts to restore the caller's snapshot called name, if
// there is one and name is not one of E2B's template names.
func (h *Handler) fromSnapshot(ctx context.Context, opts *sandbox.CreateOptions, name string) {
	if _, ok := templates[name]; ok || sandbox.ValidSnapshotName(name) != nil {
		return
	}
	if _, err := h.im.GetSnapshot(ctx, opts.Owner, name); err == nil {
		// The snapshot fixes template and network; the SDKs send
		// allowInternetAccess on every create, so it is not a request.
		opts.Snapshot, opts.Template, opts.Network = name, "", nil
	}
}
