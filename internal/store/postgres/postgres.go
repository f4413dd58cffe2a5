// Package postgres is Kiln's PostgreSQL store: sandbox records, API keys
// and template records in a shared database, for deployments that already
// run PostgreSQL or want several kiln serve hosts on one store. Same
// semantics as the SQLite store; both pass internal/store/storetest.
package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kiln-sh/kiln/internal/apikey"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

var (
	_ sandbox.Store = (*Store)(nil)
	_ apikey.Store  = (*Store)(nil)
)

//go:embed migrations/*.sql
var migrations embed.FS

// connectTimeout bounds connecting to the database unless the URL sets
// connect_timeout.
const connectTimeout = 5 * time.Second

// migrationLock is the pg_advisory_xact_lock key that serialises schema
// migrations when several kiln serve processes start at once.
const migrationLock = 0x6b696c6e // "kiln"

// Store is a PostgreSQL database holding sandbox, API key and template
// records. It is safe for concurrent use.
type Store struct {
	pool db
}

// Open connects to the database at url (postgres://… or postgresql://…;
// libpq parameters such as sslmode and search_path go in the query) and
// brings its schema up to date.
func Open(ctx context.Context, url string) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		// pgx redacts the password from its parse errors.
		return nil, fmt.Errorf("parsing postgres url: %w: %w", errdefs.ErrInvalidArgument, err)
	}
	// A database that cannot be reached (a partition, a host that is
	// gone) fails a connection in this long rather than when the system
	// gives up on it, minutes later: the catalog is unavailable.
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = connectTimeout
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting to postgres: %w", err)
	}
	// The whole cause for the operator: this error is not an API
	// client's.
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connecting to postgres: %w: %w", errdefs.ErrUnavailable, err)
	}
	s := &Store{pool: newDB(pool)}
	if err := s.migrate(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return s, nil
}

// Close releases the connections, waiting for queries in flight.
func (s *Store) Close() error {
	s.pool.Close()
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

// migrate applies, in one transaction under an advisory lock, every
// embedded migration newer than the database's schema_version. A database
// written by a newer Kiln is refused rather than guessed at.
func (s *Store) migrate(ctx context.Context) error {
	files, err := migrationFiles()
	if err != nil {
		return err
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("beginning migration: %w", err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(migrationLock)); err != nil {
		return fmt.Errorf("locking schema: %w", err)
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_version (version integer NOT NULL)`); err != nil {
		return fmt.Errorf("creating schema_version: %w", err)
	}
	var have int
	if err := tx.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM schema_version`).Scan(&have); err != nil {
		return fmt.Errorf("reading schema version: %w", err)
	}
	if have > len(files) {
		return fmt.Errorf("schema version %d is newer than this kiln's %d: %w", have, len(files), errdefs.ErrFailedPrecondition)
	}
	for _, m := range files[have:] {
		body, err := migrations.ReadFile("migrations/" + m.name)
		if err != nil {
			return fmt.Errorf("reading migration %s: %w", m.name, err)
		}
		if _, err := tx.Exec(ctx, string(body)); err != nil {
			return fmt.Errorf("applying migration %s: %w", m.name, err)
		}
	}
	if _, err := tx.Exec(ctx, `DELETE FROM schema_version`); err != nil {
		return fmt.Errorf("recording schema version: %w", err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO schema_version (version) VALUES ($1)`, len(files)); err != nil {
		return fmt.Errorf("recording schema version: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("committing migrations: %w", err)
	}
	return nil
}

// isUniqueViolation reports whether err is a UNIQUE or PRIMARY KEY
// violation.
func isUniqueViolation(err error) bool {
	var e *pgconn.PgError
	return errors.As(err, &e) && e.Code == "23505"
}

// notFound maps "no rows" to errdefs.ErrNotFound.
func notFound(err error) bool { return errors.Is(err, pgx.ErrNoRows) }
