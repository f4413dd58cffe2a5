package postgres_test

import (
	"context"
	"fmt"
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
	url, conn, migrations := oldSchema(t, 4)
	ctx := context.Background()
	created := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
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
	if err := conn.QueryRow(ctx, `SELECT version FROM schema_version`).Scan(&version); err != nil || version != migrations {
		t.Errorf("schema_version = %d, %v; want %d", version, err, migrations)
	}
}

// oldSchema makes a fresh schema as a Kiln at schema version left it: the
// migrations up to that one applied, and its schema_version. It returns
// the schema's URL, a connection to it and the number of migrations.
func oldSchema(t *testing.T, version int) (string, *pgx.Conn, int) {
	t.Helper()
	url := pgtest.URL(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	n := storetest.ApplyMigrations(t, version, func(body string) error { _, err := conn.Exec(ctx, body); return err })
	if _, err := conn.Exec(ctx, fmt.Sprintf(`CREATE TABLE schema_version (version integer NOT NULL);
		INSERT INTO schema_version VALUES (%d)`, version)); err != nil {
		t.Fatal(err)
	}
	return url, conn, n
}

// TestMigrationBuildProgress upgrades a schema at version 6, whose build
// records had no start time nor step counts (the server read the log for
// them): they get their creation as start, and ready ones every step done.
func TestMigrationBuildProgress(t *testing.T) {
	url, conn, _ := oldSchema(t, 6)
	created := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, b := range storetest.OldBuilds {
		if _, err := conn.Exec(context.Background(), `INSERT INTO template_builds (id, template, owner, status, spec, reason,
			step, layers, config, node, created_at) VALUES ($1, 'app', 'key_a', $2, $3::jsonb, '', -1, '[]', '{}', 'n', $4)`,
			b.ID, b.Status, b.Spec, created); err != nil {
			t.Fatal(err)
		}
	}
	storetest.CheckUpgradedBuilds(t, open(t, url), created)
}
