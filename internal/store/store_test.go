package store_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/store"
	"github.com/kiln-sh/kiln/internal/store/postgres"
	"github.com/kiln-sh/kiln/internal/store/postgres/pgtest"
	"github.com/kiln-sh/kiln/internal/store/sqlite"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func TestOpen(t *testing.T) {
	abs := filepath.Join(t.TempDir(), "custom.db")
	tests := []struct {
		name    string
		spec    string
		dataDir string
		want    any    // the backend's type
		file    string // the SQLite file that must exist afterwards
	}{
		{"default", "", "data", &sqlite.Store{}, "data/kiln.db"},
		{"sqlite", "sqlite", "nested/data", &sqlite.Store{}, "nested/data/kiln.db"},
		{"sqlite path", "sqlite:" + abs, "", &sqlite.Store{}, abs},
		{"sqlite memory", "sqlite::memory:", "", &sqlite.Store{}, ""},
		{"postgres", "postgres", "", &postgres.Store{}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			spec, dataDir := tt.spec, tt.dataDir
			if spec == "postgres" {
				spec = pgtest.URL(t)
			}
			if dataDir != "" {
				dataDir = filepath.Join(dir, dataDir)
			}
			b, err := store.Open(context.Background(), spec, dataDir)
			if err != nil {
				t.Fatalf("Open(%q): %v", spec, err)
			}
			defer b.Close()
			if got, want := typeName(b), typeName(tt.want); got != want {
				t.Errorf("Open(%q) = %s, want %s", spec, got, want)
			}
			if err := b.PutSandbox(context.Background(), sandbox.Sandbox{ID: "opentest0001"}); err != nil {
				t.Errorf("PutSandbox: %v", err)
			}
			if tt.file != "" {
				file := tt.file
				if !filepath.IsAbs(file) {
					file = filepath.Join(dir, file)
				}
				if _, err := os.Stat(file); err != nil {
					t.Errorf("database file: %v", err)
				}
			}
		})
	}
}

func TestOpenPostgresqlScheme(t *testing.T) {
	url := "postgresql" + strings.TrimPrefix(pgtest.URL(t), "postgres")
	b, err := store.Open(context.Background(), url, "")
	if err != nil {
		t.Fatalf("Open(postgresql://…): %v", err)
	}
	b.Close()
}

func TestOpenInvalid(t *testing.T) {
	for _, spec := range []string{
		"mysql://kiln:hunter2@db/kiln",
		"sqlite:relative/kiln.db",
		"bolt",
		"SQLITE",
	} {
		_, err := store.Open(context.Background(), spec, t.TempDir())
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Open(%q) = %v, want ErrInvalidArgument", spec, err)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("Open(%q) error leaks the password: %v", spec, err)
		}
	}
	if _, err := store.Open(context.Background(), "sqlite", ""); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Open(sqlite, no data dir) = %v, want ErrInvalidArgument", err)
	}
}

func typeName(v any) string {
	switch v.(type) {
	case *sqlite.Store:
		return "sqlite"
	case *postgres.Store:
		return "postgres"
	}
	return "unknown"
}
