package server

import (
	"fmt"
	"net/http"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// Uploaded build files: the tar of a COPY/ADD step's sources, or an image
// archive, stored per key under its hash (builder.PutFiles) for that
// key's builds to read.

// headFiles answers 200 if the caller uploaded {hash}, else 404.
func (s *Server) headFiles(w http.ResponseWriter, r *http.Request) error {
	if err := s.templatesOn(); err != nil {
		return err
	}
	ok, err := s.builder.HasFiles(caller(r).ID, r.PathValue("hash"))
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("files %.12s were not uploaded: %w", r.PathValue("hash"), errdefs.ErrNotFound)
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

// putFiles stores the body as the caller's upload {hash}; over the
// server's limit it answers 413.
func (s *Server) putFiles(w http.ResponseWriter, r *http.Request) error {
	if err := s.templatesOn(); err != nil {
		return err
	}
	if err := s.builder.PutFiles(caller(r).ID, r.PathValue("hash"), r.Body, r.ContentLength); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
