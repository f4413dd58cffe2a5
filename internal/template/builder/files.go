package builder

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// Uploaded build files: the tar of a COPY/ADD step's sources, or an image
// archive, stored per owner under its hash for that owner's builds to
// read. Both of kiln serve's APIs (/v1/templates/files and E2B's upload
// URLs) store them here.

// HasFiles reports whether owner uploaded the files of hash.
func (b *Builder) HasFiles(owner, hash string) (bool, error) {
	p, err := b.FilesPath(owner, hash)
	if err != nil {
		return false, err
	}
	switch _, err := os.Stat(p); {
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("looking up an upload: %w", err)
	}
	return true, nil
}

// PutFiles stores body as owner's upload hash: written to a temporary
// file, bounded by MaxContextBytes while it streams (size is the declared
// length, -1 if unknown), synced, then renamed into place, so a build
// never reads a partial upload. Over the limit it answers
// *errdefs.TooLarge.
func (b *Builder) PutFiles(owner, hash string, body io.Reader, size int64) error {
	p, err := b.FilesPath(owner, hash)
	if err != nil {
		return err
	}
	limit := b.cfg.MaxContextBytes
	tooLarge := &errdefs.TooLarge{What: "the upload", Limit: limit}
	if size > limit {
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
	n, err := io.Copy(f, io.LimitReader(body, limit+1))
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
	return nil
}
