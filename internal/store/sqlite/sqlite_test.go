package sqlite_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/kiln-sh/kiln/internal/store"
	"github.com/kiln-sh/kiln/internal/store/sqlite"
	"github.com/kiln-sh/kiln/internal/store/storetest"
)

func open(t testing.TB, path string) *sqlite.Store {
	t.Helper()
	s, err := sqlite.Open(context.Background(), path)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func TestConformanceFile(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Backend {
		return open(t, filepath.Join(t.TempDir(), "kiln.db"))
	})
}

func TestConformanceMemory(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Backend { return open(t, sqlite.Memory) })
}
