package server

import (
	"fmt"
	"net/http"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/volume"
)

// The caller's persistent volumes (internal/volume): /v1/volumes.

var errNoVolumes = fmt.Errorf("volumes are not enabled on this server: %w", errdefs.ErrUnavailable)

// createVolume makes one of the caller's volumes.
func (s *Server) createVolume(w http.ResponseWriter, r *http.Request) error {
	if s.volumes == nil {
		return errNoVolumes
	}
	var req api.CreateVolumeRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	if req.SizeBytes < 0 {
		return invalid("size_bytes must not be negative (0 takes the default)")
	}
	v, err := s.volumes.Create(r.Context(), caller(r).ID, req.Name, req.SizeBytes)
	if err != nil {
		return fmt.Errorf("creating volume: %w", err)
	}
	return writeJSON(w, http.StatusCreated, volumeToAPI(v))
}

// listVolumes lists the caller's volumes, oldest first, with their total
// size.
func (s *Server) listVolumes(w http.ResponseWriter, r *http.Request) error {
	if s.volumes == nil {
		return errNoVolumes
	}
	if err := checkQuery(r.URL.Query()); err != nil {
		return err
	}
	vs, err := s.volumes.List(r.Context(), caller(r).ID)
	if err != nil {
		return fmt.Errorf("listing volumes: %w", err)
	}
	out := api.VolumeList{Volumes: make([]api.Volume, 0, len(vs))}
	for _, v := range vs {
		out.Volumes = append(out.Volumes, volumeToAPI(v))
		out.TotalBytes += v.SizeBytes
	}
	return writeJSON(w, http.StatusOK, out)
}

// getVolume returns the caller's volume {id} (its id or name).
func (s *Server) getVolume(w http.ResponseWriter, r *http.Request) error {
	if s.volumes == nil {
		return errNoVolumes
	}
	v, err := s.volumes.Get(r.Context(), caller(r).ID, r.PathValue("id"))
	if err != nil {
		return fmt.Errorf("getting volume: %w", err)
	}
	return writeJSON(w, http.StatusOK, volumeToAPI(v))
}

// deleteVolume deletes the caller's volume {id} and its data; one that a
// sandbox which has not ended mounts is 409.
func (s *Server) deleteVolume(w http.ResponseWriter, r *http.Request) error {
	if s.volumes == nil {
		return errNoVolumes
	}
	if err := s.volumes.Delete(r.Context(), caller(r).ID, r.PathValue("id")); err != nil {
		return fmt.Errorf("deleting volume: %w", err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func volumeToAPI(v volume.Volume) api.Volume {
	return api.Volume{ID: v.ID, Name: v.Name, SizeBytes: v.SizeBytes, CreatedAt: v.CreatedAt}
}

func mountsFromAPI(ms []api.VolumeMount) []sandbox.VolumeMount {
	if len(ms) == 0 {
		return nil
	}
	out := make([]sandbox.VolumeMount, len(ms))
	for i, m := range ms {
		out[i] = sandbox.VolumeMount(m)
	}
	return out
}

func mountsToAPI(ms []sandbox.VolumeMount) []api.VolumeMount {
	if len(ms) == 0 {
		return nil
	}
	out := make([]api.VolumeMount, len(ms))
	for i, m := range ms {
		out[i] = api.VolumeMount(m)
	}
	return out
}
