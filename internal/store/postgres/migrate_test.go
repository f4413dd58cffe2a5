package postgres_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kiln-sh/kiln/internal/store/postgres/pgtest"
	"github.com/kiln-sh/kiln/internal/store/storetest"
)

// TestMigrationTemplates upgrades a database at schema 4, as the Kiln
// before custom templates left it: its sandboxes stay, and template builds
// and tags can be stored and survive a reopen.
func TestMigrationTemplates(t *testing.T) {
	url := pgtest.URL(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	files, err := filepath.Glob(filepath.Join("migrations", "*.sql"))
	if err != nil || len(files) <= 4 {
		t.Fatalf("migrations: %v, %v; want more than 4", files, err)
	}
	slices.Sort(files)
	for _, f := range files[:4] {
		body, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, string(body)); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
	created := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	if _, err := conn.Exec(ctx, `CREATE TABLE schema_version (version integer NOT NULL);
		INSERT INTO schema_version VALUES (4)`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO sandboxes (id, template, runtime, state, reason, limits, user_name, workdir,
		env, metadata, owner, node, created_at) VALUES ('oldrunning01', 'base', 'runc', 'running', '', '{}', 'user', '/',
		'{"E":"1"}', '{}', 'key_a', 'n', $1)`, created); err != nil {
		t.Fatal(err)
	}

	s := open(t, url)
	if sb, err := s.GetSandbox(ctx, "oldrunning01"); err != nil || sb.Env["E"] != "1" {
		t.Errorf("sandbox after upgrade = %+v, %v", sb, err)
	}
	storetest.PutTemplateRecords(t, s)
	s.Close()

	s = open(t, url)
	storetest.CheckTemplateRecords(t, s)
	var version int
	if err := conn.QueryRow(ctx, `SELECT version FROM schema_version`).Scan(&version); err != nil || version != len(files) {
		t.Errorf("schema_version = %d, %v; want %d", version, err, len(files))
	}
}
