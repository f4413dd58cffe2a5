// Package store is the registry of Kiln's storage backends: it turns the
// user's --store spec into an open Backend. The backends themselves live
// in internal/store/sqlite (embedded, the default) and
// internal/store/postgres; internal/store/storetest holds the suite both
// pass.
package store

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/kiln-sh/kiln/internal/apikey"
	"github.com/kiln-sh/kiln/internal/cluster"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/store/postgres"
	"github.com/kiln-sh/kiln/internal/store/sqlite"
	"github.com/kiln-sh/kiln/internal/template"
	"github.com/kiln-sh/kiln/internal/volume"
)

// Backend stores everything kiln serve must not forget: sandbox records,
// API keys, the records of custom templates and of volumes, and the
// cluster's node registry.
type Backend interface {
	sandbox.Store
	cluster.Store
	apikey.Store
	template.Store
	volume.Store
	Close() error
}

var (
	_ Backend = (*sqlite.Store)(nil)
	_ Backend = (*postgres.Store)(nil)
)

// DefaultFile is the SQLite database's name inside the data directory.
const DefaultFile = "kiln.db"

// Open opens the backend that spec names:
//
//	"" or "sqlite"        SQLite at dataDir/kiln.db (dataDir is created)
//	"sqlite:/abs/path"    SQLite at that path ("sqlite::memory:" for an
//	                      ephemeral store)
//	"postgres://…"        PostgreSQL (also "postgresql://…")
//
// Anything else is errdefs.ErrInvalidArgument.
func Open(ctx context.Context, spec, dataDir string) (Backend, error) {
	switch {
	case spec == "" || spec == "sqlite":
		if dataDir == "" {
			return nil, fmt.Errorf("opening store: sqlite needs a data directory: %w", errdefs.ErrInvalidArgument)
		}
		if err := os.MkdirAll(dataDir, 0o700); err != nil {
			return nil, fmt.Errorf("creating data directory: %w", err)
		}
		return sqlite.Open(ctx, filepath.Join(dataDir, DefaultFile))
	case strings.HasPrefix(spec, "sqlite:"):
		path := strings.TrimPrefix(spec, "sqlite:")
		if path != sqlite.Memory && !filepath.IsAbs(path) {
			return nil, fmt.Errorf("opening store: sqlite path %q is not absolute: %w", path, errdefs.ErrInvalidArgument)
		}
		return sqlite.Open(ctx, path)
	case strings.HasPrefix(spec, "postgres://"), strings.HasPrefix(spec, "postgresql://"):
		return postgres.Open(ctx, spec)
	}
	// Only the scheme is echoed: the rest may hold a password.
	scheme, _, _ := strings.Cut(spec, ":")
	return nil, fmt.Errorf(`opening store: unknown kind %q, want "sqlite", "sqlite:/abs/path" or "postgres://…": %w`,
		scheme, errdefs.ErrInvalidArgument)
}
