package postgres

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// eq is one optional equality filter of a listing: col = val, unless val
// is "" (no filter on col).
type eq struct{ col, val string }

// where turns filters into a WHERE clause ("" if none applies) and its
// arguments, numbered from $1.
func where(filters ...eq) (string, []any) {
	var conds []string
	var args []any
	for _, f := range filters {
		if f.val != "" {
			args = append(args, f.val)
			conds = append(conds, f.col+" = $"+strconv.Itoa(len(args)))
		}
	}
	if len(conds) == 0 {
		return "", nil
	}
	return " WHERE " + strings.Join(conds, " AND "), args
}

// queryAll runs q on pool and scans every row; what names the records in
// errors.
func queryAll[T any](ctx context.Context, pool db, what string, scan func(scanner) (T, error), q string, args ...any) ([]T, error) {
	rows, err := pool.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", what, err)
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, fmt.Errorf("listing %s: %w", what, err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing %s: %w", what, err)
	}
	return out, nil
}

// affected turns a write's outcome into an error: doing for a failed
// one, errdefs.ErrNotFound (naming what) if it touched no row.
func affected(res pgconn.CommandTag, err error, doing, what string) error {
	if err != nil {
		return fmt.Errorf("%s: %w", doing, err)
	}
	if res.RowsAffected() == 0 {
		return fmt.Errorf("%s: %w", what, errdefs.ErrNotFound)
	}
	return nil
}
