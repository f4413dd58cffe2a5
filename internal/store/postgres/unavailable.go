package postgres

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// db is the connection pool with every error classed: an error of the
// connection rather than of the statement (the database cannot be
// connected to, is shutting down or restarting, or the connection broke)
// is errdefs.ErrUnavailable with a message that names the catalog and not
// its address (see unavailable). Every query of the store goes through
// it or a transaction it began, so this is the one place store errors are
// classed so.
type db struct {
	classed
	pool *pgxpool.Pool
}

func newDB(pool *pgxpool.Pool) db { return db{classed{pool}, pool} }

// Begin begins a transaction whose errors are classed too.
func (d db) Begin(ctx context.Context) (txn, error) {
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return txn{}, classify(err)
	}
	return txn{classed{tx}, tx}, nil
}

func (d db) Close() { d.pool.Close() }

// txn is a transaction with its errors classed.
type txn struct {
	classed
	tx pgx.Tx
}

func (t txn) Commit(ctx context.Context) error { return classify(t.tx.Commit(ctx)) }

// Rollback ends the transaction if it has not ended (for a defer).
func (t txn) Rollback(ctx context.Context) { _ = t.tx.Rollback(ctx) }

// querier is what a pool and a transaction share.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// classed is a querier with its errors classed.
type classed struct{ q querier }

func (c classed) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	tag, err := c.q.Exec(ctx, sql, args...)
	return tag, classify(err)
}

func (c classed) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	rows, err := c.q.Query(ctx, sql, args...)
	if err != nil {
		return nil, classify(err)
	}
	return classedRows{rows}, nil
}

func (c classed) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return classedRow{c.q.QueryRow(ctx, sql, args...)}
}

type classedRow struct{ pgx.Row }

func (r classedRow) Scan(dest ...any) error { return classify(r.Row.Scan(dest...)) }

type classedRows struct{ pgx.Rows }

func (r classedRows) Err() error { return classify(r.Rows.Err()) }

func (r classedRows) Scan(dest ...any) error { return classify(r.Rows.Scan(dest...)) }

// unavailableError is a connection-level failure of the catalog: its
// message says what happened without the database's address or user,
// since it reaches API clients; the cause stays in the chain for
// errors.As.
type unavailableError struct {
	what  string
	cause error
}

func (e *unavailableError) Error() string { return "catalog unavailable: " + e.what }

func (e *unavailableError) Unwrap() []error { return []error{errdefs.ErrUnavailable, e.cause} }

// classify returns err as an unavailableError when it is one of the
// connection rather than of the statement; other errors (and nil) as
// they are. A context's end stays what it is (the caller's deadline, not
// the catalog's), except while connecting.
func classify(err error) error {
	if err == nil || errors.Is(err, errdefs.ErrUnavailable) {
		return err
	}
	if what := unavailable(err); what != "" {
		return &unavailableError{what: what, cause: err}
	}
	return err
}

// unavailable says how err is a failure of the connection to the
// database, or "" when it is not one.
func unavailable(err error) string {
	pe, fromServer := errors.AsType[*pgconn.PgError](err)
	_, connecting := errors.AsType[*pgconn.ConnectError](err)
	if fromServer {
		switch {
		case pe.Code == "57P01" || pe.Code == "57P02":
			return "the database is shutting down (" + pe.Code + ")"
		case pe.Code == "57P03":
			return "the database is starting up or recovering (57P03)"
		case pe.Code == "53300":
			return "the database has no free connection (53300)"
		case strings.HasPrefix(pe.Code, "08"):
			return "connection exception (" + pe.Code + ")"
		}
	}
	switch {
	case connecting:
		// Refused, or not answering in time (even the caller's time):
		// the catalog is unavailable to this process.
		return "cannot connect to the database" + sysReason(err)
	case fromServer:
		return "" // the statement's own error
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return "" // the caller's deadline, not the catalog's
	case errors.Is(err, pgconn.ErrConnClosed) || errors.Is(err, net.ErrClosed):
		return "the connection to the database was closed"
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE):
		return "the connection to the database broke"
	}
	if _, ok := errors.AsType[net.Error](err); ok {
		return "the connection to the database failed" + sysReason(err)
	}
	return ""
}

// sysReason is the system's reason for a failed connection (e.g.
// "connection refused"), without addresses: ": reason", or "".
func sysReason(err error) string {
	if errno, ok := errors.AsType[syscall.Errno](err); ok {
		return ": " + errno.Error()
	}
	if _, ok := errors.AsType[*net.DNSError](err); ok {
		return ": the database's host name does not resolve"
	}
	return ""
}
