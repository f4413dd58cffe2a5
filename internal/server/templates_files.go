package server

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// Uploaded build files: the tar of a COPY/ADD step's sources, or an image
// archive, stored per key under its hash (builder.FilesPath) for that
// key's builds to read.

// tooLargeError is a request body over its limit: resource_exhausted,
// answered 413 rather than 429 (writeError).
type tooLargeError struct {
	what  string
	limit int64
}

func (e *tooLargeError) Error() string {
	return fmt.Sprintf("%s is larger than the %d bytes this server allows", e.what, e.limit)
}

func (e *tooLargeError) Unwrap() error { return errdefs.ErrResourceExhausted }

// filesPath is where the caller's upload {hash} is kept.
func (s *Server) filesPath(r *http.Request) (string, error) {
	if err := s.templatesOn(); err != nil {
		return "", err
	}
	return s.builder.FilesPath(caller(r).ID, r.PathValue("hash"))
}

// headFiles answers 200 if the caller uploaded {hash}, else 404.
func (s *Server) headFiles(w http.ResponseWriter, r *http.Request) error {
	p, err := s.filesPath(r)
	if err != nil {
		return err
	}
	if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("files %.12s were not uploaded: %w", r.PathValue("hash"), errdefs.ErrNotFound)
	} else if err != nil {
		return fmt.Errorf("looking up an upload: %w", err)
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

// putFiles stores the body as the caller's upload {hash}: written to a
// temporary file, bounded while it streams, then renamed into place.
func (s *Server) putFiles(w http.ResponseWriter, r *http.Request) error {
	p, err := s.filesPath(r)
	if err != nil {
		return err
	}
	limit := s.cfg.Server.Builds.WithDefaults().MaxContextBytes
	tooLarge := &tooLargeError{what: "the upload", limit: limit}
	if r.ContentLength > limit {
		return tooLarge
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return fmt.Errorf("storing an upload: %w", err)
	}
	f, err := os.CreateTemp(filepath.Dir(p), ".upload-*")
	if err != nil {
		return fmt.Errorf("storing an upload: %w", err)
	}
	defer os.Remove(f.Name()) // after a rename, a no-op
	n, err := io.Copy(f, io.LimitReader(r.Body, limit+1))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	switch {
	case err != nil:
		return fmt.Errorf("storing an upload: %w", err)
	case n > limit:
		return tooLarge
	}
	if err := os.Rename(f.Name(), p); err != nil {
		return fmt.Errorf("storing an upload: %w", err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
