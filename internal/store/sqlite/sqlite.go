// Package sqlite is Kiln's embedded store: sandbox records, API keys and
// template records in one SQLite file (pure Go, modernc.org/sqlite), the
// default backend.
//
// The database runs in WAL mode with synchronous=NORMAL: a commit reaches
// the operating system before it is acknowledged, so a crash of kiln serve
// (even kill -9) loses nothing acknowledged; only a power loss or kernel
// crash may lose the last few commits. Writes go through one connection
// (SQLite has a single writer anyway, and queueing in Go is cheaper than
// busy-waiting on the file lock); reads use a pool of read-only ones.
package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"

	"modernc.org/sqlite"

	"github.com/kiln-sh/kiln/internal/apikey"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// Memory is the path of an ephemeral store that lives as long as the
// Store value (for tests and throwaway servers).
const Memory = ":memory:"

var (
	_ sandbox.Store = (*Store)(nil)
	_ apikey.Store  = (*Store)(nil)
)

//go:embed migrations/*.sql
var migrations embed.FS

// Store is a SQLite database holding sandbox, API key and template
// records. It is safe for concurrent use, also by several processes on one
// file.
type Store struct {
	w *sql.DB // the one writer connection
	r *sql.DB // read-only connections; == w for an in-memory store
}

// pragmas apply to every connection. busy_timeout covers other processes
// holding the write lock (the writer pool already serialises this one).
var pragmas = []string{
	"busy_timeout(10000)",
	"foreign_keys(1)",
	"synchronous(NORMAL)",
}

// Open opens (creating if needed) the database at path, an absolute or
// relative file name or Memory, and brings its schema up to date.
func Open(ctx context.Context, path string) (*Store, error) {
	if path == "" {
		return nil, fmt.Errorf("opening sqlite store: empty path: %w", errdefs.ErrInvalidArgument)
	}
	if path == Memory {
		// Every connection to ":memory:" is a separate database, and the
		// database dies with its connection: keep exactly one, forever.
		db, err := sql.Open("sqlite", dsn(Memory, "", false))
		if err != nil {
			return nil, fmt.Errorf("opening sqlite store: %w", err)
		}
		db.SetMaxOpenConns(1)
		db.SetMaxIdleConns(1)
		db.SetConnMaxLifetime(0)
		db.SetConnMaxIdleTime(0)
		s := &Store{w: db, r: db}
		if err := s.migrate(ctx); err != nil {
			db.Close()
			return nil, err
		}
		return s, nil
	}
	// API key hashes and sandbox env live here: create the file (and so
	// its -wal and -shm siblings, which copy its mode) private.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("creating sqlite store: %w", err)
	}
	f.Close()
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("resolving sqlite path: %w", err)
	}
	w, err := sql.Open("sqlite", dsn(abs, "WAL", false))
	if err != nil {
		return nil, fmt.Errorf("opening sqlite store: %w", err)
	}
	w.SetMaxOpenConns(1)
	w.SetConnMaxLifetime(0)
	w.SetConnMaxIdleTime(0)
	s := &Store{w: w}
	if err := s.migrate(ctx); err != nil {
		w.Close()
		return nil, err
	}
	// Readers open after the writer switched the file to WAL.
	if s.r, err = sql.Open("sqlite", dsn(abs, "", true)); err != nil {
		w.Close()
		return nil, fmt.Errorf("opening sqlite store: %w", err)
	}
	n := max(4, runtime.NumCPU())
	s.r.SetMaxOpenConns(n)
	s.r.SetMaxIdleConns(n)
	return s, nil
}

// dsn builds a modernc.org/sqlite data source name. File paths go in a
// file: URI, escaped, so that '?', '#' and '%' in them stay part of the
// name. Write transactions BEGIN IMMEDIATE: they take the write lock up
// front and so never fail upgrading a read lock.
func dsn(path, journal string, readOnly bool) string {
	q := url.Values{}
	for _, p := range pragmas {
		q.Add("_pragma", p)
	}
	if journal != "" {
		q.Set("_journal_mode", journal)
	}
	if readOnly {
		q.Set("_query_only", "1")
	} else {
		q.Set("_txlock", "immediate")
	}
	if path == Memory {
		return Memory + "?" + q.Encode()
	}
	return "file:" + (&url.URL{Path: path}).EscapedPath() + "?" + q.Encode()
}

// Close closes the database. Everything acknowledged is already in it.
func (s *Store) Close() error {
	var rerr error
	if s.r != s.w {
		rerr = s.r.Close()
	}
	if err := errors.Join(rerr, s.w.Close()); err != nil {
		return fmt.Errorf("closing sqlite store: %w", err)
	}
	return nil
}

// migrate applies, each in its own transaction, every embedded migration
// newer than the database's schema_version. A database written by a newer
// Kiln is refused rather than guessed at.
func (s *Store) migrate(ctx context.Context) error {
	files, err := migrationFiles()
	if err != nil {
		return err
	}
	if _, err := s.w.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL) STRICT`); err != nil {
		return fmt.Errorf("creating schema_version: %w", err)
	}
	for _, m := range files {
		if err := s.apply(ctx, m, len(files)); err != nil {
			return err
		}
	}
	return nil
}

type migration struct {
	version int
	name    string
}

func migrationFiles() ([]migration, error) {
	entries, err := migrations.ReadDir("migrations")
	if err != nil {
		return nil, fmt.Errorf("reading migrations: %w", err)
	}
	var ms []migration
	for _, e := range entries {
		v, err := strconv.Atoi(strings.SplitN(e.Name(), "_", 2)[0])
		if err != nil {
			return nil, fmt.Errorf("parsing migration name %q: %w", e.Name(), err)
		}
		ms = append(ms, migration{v, e.Name()})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].version < ms[j].version })
	for i, m := range ms {
		if m.version != i+1 {
			return nil, fmt.Errorf("checking migrations: %s out of sequence", m.name)
		}
	}
	return ms, nil
}

func (s *Store) apply(ctx context.Context, m migration, latest int) error {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("beginning migration: %w", err)
	}
	defer tx.Rollback()
	var have int
	if err := tx.QueryRowContext(ctx, `SELECT coalesce(max(version), 0) FROM schema_version`).Scan(&have); err != nil {
		return fmt.Errorf("reading schema version: %w", err)
	}
	if have > latest {
		return fmt.Errorf("schema version %d is newer than this kiln's %d: %w", have, latest, errdefs.ErrFailedPrecondition)
	}
	if have >= m.version {
		return nil
	}
	body, err := migrations.ReadFile("migrations/" + m.name)
	if err != nil {
		return fmt.Errorf("reading migration %s: %w", m.name, err)
	}
	if _, err := tx.ExecContext(ctx, string(body)); err != nil {
		return fmt.Errorf("applying migration %s: %w", m.name, err)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM schema_version`); err != nil {
		return fmt.Errorf("recording schema version: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO schema_version (version) VALUES (?)`, m.version); err != nil {
		return fmt.Errorf("recording schema version: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("committing migration %s: %w", m.name, err)
	}
	return nil
}

// isConstraint reports whether err is a UNIQUE or PRIMARY KEY violation.
func isConstraint(err error) bool {
	var e *sqlite.Error
	if !errors.As(err, &e) {
		return false
	}
	const primaryKey, unique = 1555, 2067 // SQLITE_CONSTRAINT_{PRIMARYKEY,UNIQUE}
	return e.Code() == primaryKey || e.Code() == unique
}
