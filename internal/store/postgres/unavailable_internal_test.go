package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// TestClassify: errors of the connection are unavailable, saying what
// happened without addresses; errors of the statement and the caller's
// own deadline are left as they are.
func TestClassify(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Addr: &net.TCPAddr{IP: net.IPv4(10, 0, 0, 5), Port: 5432},
		Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	for _, tc := range []struct {
		name string
		err  error
		want string // "" : not unavailable
	}{
		{"admin shutdown", &pgconn.PgError{Code: "57P01", Message: "terminating connection due to administrator command"}, "shutting down"},
		{"starting up", fmt.Errorf("query: %w", &pgconn.PgError{Code: "57P03"}), "starting up"},
		{"connection exception", &pgconn.PgError{Code: "08006"}, "connection exception"},
		{"too many connections", &pgconn.PgError{Code: "53300"}, "no free connection"},
		{"a broken connection", fmt.Errorf("receive message failed: %w", io.ErrUnexpectedEOF), "broke"},
		{"a reset", fmt.Errorf("write: %w", syscall.ECONNRESET), "broke"},
		{"a closed connection", fmt.Errorf("query: %w", pgconn.ErrConnClosed), "closed"},
		{"a refused dial", fmt.Errorf("dial: %w", refused), "connection refused"},
		{"a unique violation", &pgconn.PgError{Code: "23505"}, ""},
		{"no rows", pgx.ErrNoRows, ""},
		{"the caller's deadline", fmt.Errorf("query: %w", context.DeadlineExceeded), ""},
		{"the caller went away", context.Canceled, ""},
		{"nil", nil, ""},
	} {
		got := classify(tc.err)
		switch {
		case tc.want == "" && got != tc.err:
			t.Errorf("%s: classify = %v, want it unchanged", tc.name, got)
		case tc.want != "" && (!errors.Is(got, errdefs.ErrUnavailable) || !strings.HasPrefix(got.Error(), "catalog unavailable: ") ||
			!strings.Contains(got.Error(), tc.want) || strings.Contains(got.Error(), "10.0.0.5")):
			t.Errorf("%s: classify = %v, want unavailable saying %q, without the address", tc.name, got, tc.want)
		case tc.want != "" && !errors.Is(got, tc.err):
			t.Errorf("%s: classify = %v lost its cause", tc.name, got)
		}
	}
}
