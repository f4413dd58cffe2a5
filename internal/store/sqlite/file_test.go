package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/store/sqlite"
	"github.com/kiln-sh/kiln/internal/store/storetest"
)

func TestReopenKeepsRecords(t *testing.T) {
	// A name that needs escaping in a file: URI.
	path := filepath.Join(t.TempDir(), "dir with space", "k?iln#1%.db")
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	sb := sandbox.Sandbox{ID: "reopen000001", State: sandbox.StateRunning, CreatedAt: time.Now()}
	if err := s.PutSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	storetest.PutTemplateRecords(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, path) // migrations are idempotent
	if _, err := s.GetSandbox(ctx, sb.ID); err != nil {
		t.Errorf("after reopen: %v", err)
	}
	storetest.CheckTemplateRecords(t, s)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatalf("database not at %q: %v", path, err)
	}
	if mode := fi.Mode().Perm(); mode != 0o600 {
		t.Errorf("database mode = %v, want 0600", mode)
	}
	// Raw access needs the same escaping the store does.
	db, err := sql.Open("sqlite", "file:"+(&url.URL{Path: path}).EscapedPath())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var journal string
	var version int
	if err := db.QueryRow(`PRAGMA journal_mode`).Scan(&journal); err != nil || journal != "wal" {
		t.Errorf("journal_mode = %q, %v; want wal", journal, err)
	}
	migrations, err := os.ReadDir("migrations")
	if err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow(`SELECT version FROM schema_version`).Scan(&version); err != nil || version != len(migrations) {
		t.Errorf("schema_version = %d, %v; want %d", version, err, len(migrations))
	}
}

func TestRefusesNewerSchema(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kiln.db")
	open(t, path).Close()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`UPDATE schema_version SET version = 99`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if _, err := sqlite.Open(context.Background(), path); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Open(newer schema) = %v, want ErrFailedPrecondition", err)
	}
}

// TestTwoStoresOneFile writes through two Stores on one file at once, as
// two processes would: they contend for SQLite's file lock, not a Go one.
func TestTwoStoresOneFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kiln.db")
	stores := []*sqlite.Store{open(t, path), open(t, path)}
	var wg sync.WaitGroup
	for w := range 10 {
		wg.Go(func() {
			s := stores[w%2]
			for i := range 20 {
				sb := sandbox.Sandbox{ID: sandbox.ID(fmt.Sprintf("two%03d%04d", w, i)), CreatedAt: time.Now()}
				if err := s.PutSandbox(context.Background(), sb); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	all, _, err := stores[0].ListSandboxes(context.Background(), sandbox.Filter{Limit: 1000})
	if err != nil || len(all) != 200 {
		t.Errorf("ListSandboxes = %d records, %v; want 200", len(all), err)
	}
}

func TestOpenEmptyPath(t *testing.T) {
	if _, err := sqlite.Open(context.Background(), ""); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Open(\"\") = %v, want ErrInvalidArgument", err)
	}
}

func BenchmarkPutSandbox(b *testing.B) {
	s := open(b, filepath.Join(b.TempDir(), "kiln.db"))
	ctx := context.Background()
	sb := sandbox.Sandbox{Template: "base", Runtime: "runsc", State: sandbox.StateRunning,
		Limits: sandbox.Limits{CPUs: 1, MemoryBytes: 512 << 20}, User: "user", Workdir: "/home/user",
		Env: map[string]string{"PATH": "/usr/bin"}, Metadata: map[string]string{"run": "1", "team": "rl"},
		CreatedAt: time.Now()}
	i := 0
	for b.Loop() {
		sb.ID = sandbox.ID(fmt.Sprintf("bench%08d", i))
		i++
		if err := s.PutSandbox(ctx, sb); err != nil {
			b.Fatal(err)
		}
	}
}
