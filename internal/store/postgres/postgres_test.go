package postgres_test

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/store"
	"github.com/kiln-sh/kiln/internal/store/postgres"
	"github.com/kiln-sh/kiln/internal/store/postgres/pgtest"
	"github.com/kiln-sh/kiln/internal/store/storetest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func open(t *testing.T, url string) *postgres.Store {
	t.Helper()
	s, err := postgres.Open(context.Background(), url)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	pgtest.Require(t)
	storetest.Run(t, func(t *testing.T) store.Backend { return open(t, pgtest.URL(t)) })
}

// TestConcurrentMigrations opens several stores on one empty schema at
// once, as kiln serve processes starting together would.
func TestConcurrentMigrations(t *testing.T) {
	url := pgtest.URL(t)
	var wg sync.WaitGroup
	for range 5 {
		wg.Go(func() {
			s, err := postgres.Open(context.Background(), url)
			if err != nil {
				t.Error(err)
				return
			}
			s.Close()
		})
	}
	wg.Wait()
}

func TestRefusesNewerSchema(t *testing.T) {
	url := pgtest.URL(t)
	open(t, url).Close()
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), `UPDATE schema_version SET version = 99`); err != nil {
		t.Fatal(err)
	}
	if _, err := postgres.Open(context.Background(), url); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Open(newer schema) = %v, want ErrFailedPrecondition", err)
	}
}

func TestOpenBadURL(t *testing.T) {
	if _, err := postgres.Open(context.Background(), "postgres://%zz"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Open(bad url) = %v, want ErrInvalidArgument", err)
	}
}
