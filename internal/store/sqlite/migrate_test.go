package sqlite_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/store/sqlite"
	"github.com/kiln-sh/kiln/internal/store/storetest"
)

// oldDatabase makes a database as a Kiln at schema version left it: the
// migrations up to that one applied, and its schema_version. The caller
// fills it and closes it before opening it with the store.
func oldDatabase(t *testing.T, version int) (string, *sql.DB) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "old.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	storetest.ApplyMigrations(t, version, func(body string) error { _, err := db.Exec(body); return err })
	if _, err := db.Exec(`CREATE TABLE schema_version (version INTEGER NOT NULL) STRICT; INSERT INTO schema_version VALUES (?)`,
		version); err != nil {
		t.Fatal(err)
	}
	return path, db
}

// TestMigrationRetention upgrades a database at schema 3 holding an ended
// sandbox with env and metadata, as an older Kiln left it: the upgrade
// turns it into a tombstone that ended when it was created (so a
// retention run can delete it), and leaves a live one alone.
func TestMigrationRetention(t *testing.T) {
	path, db := oldDatabase(t, 3)
	created := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, r := range []struct{ id, state string }{{"oldstopped01", "stopped"}, {"oldrunning01", "running"}} {
		if _, err := db.Exec(`INSERT INTO sandboxes (id, template, runtime, state, reason, limits, user_name, workdir,
			env, metadata, owner, node, created_at) VALUES (?, 'base', 'runc', ?, '', '{}', 'user', '/', '{"E":"1"}', '{"k":"v"}', '', 'n', ?)`,
			r.id, r.state, created.UnixMicro()); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(`INSERT INTO sandbox_metadata (sandbox_id, key, value) VALUES (?, 'k', 'v')`, r.id); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()

	s := open(t, path)
	ctx := context.Background()
	old, err := s.GetSandbox(ctx, "oldstopped01")
	if err != nil {
		t.Fatal(err)
	}
	if old.Env != nil || old.Metadata != nil || !old.EndedAt.Equal(created) {
		t.Errorf("upgraded ended record: env %v metadata %v ended %v; want none, none, %v", old.Env, old.Metadata, old.EndedAt, created)
	}
	live, err := s.GetSandbox(ctx, "oldrunning01")
	if err != nil {
		t.Fatal(err)
	}
	if live.Env["E"] != "1" || live.Metadata["k"] != "v" || !live.EndedAt.IsZero() {
		t.Errorf("upgraded live record: %+v", live)
	}
	got, _, err := s.ListSandboxes(ctx, sandbox.Filter{Metadata: map[string]string{"k": "v"}})
	if err != nil || len(got) != 1 || got[0].ID != "oldrunning01" {
		t.Errorf("metadata filter after upgrade: %v, %v; want only the live record", got, err)
	}
	if n, err := s.DeleteEnded(ctx, time.Now(), 100); err != nil || n != 1 {
		t.Errorf("DeleteEnded after upgrade = %d, %v; want 1", n, err)
	}
}

// TestMigrationTemplates upgrades a database at schema 4, as the Kiln
// before custom templates left it: its sandboxes and snapshots stay, and
// template builds and tags can be stored and survive a reopen.
func TestMigrationTemplates(t *testing.T) {
	path, db := oldDatabase(t, 4)
	created := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	if _, err := db.Exec(`INSERT INTO sandboxes (id, template, runtime, state, reason, limits, user_name, workdir,
		env, metadata, owner, node, created_at) VALUES ('oldrunning01', 'base', 'runc', 'running', '', '{}', 'user', '/',
		'{"E":"1"}', '{}', 'key_a', 'n', ?)`, created.UnixMicro()); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO snapshots (id, name, owner, source, template, runtime, limits, user_name, workdir,
		env, metadata, size_bytes, node, created_at) VALUES ('oldsnap00001', 'before', 'key_a', 'oldrunning01', 'base',
		'runc', '{}', 'user', '/', '{}', '{}', 42, 'n', ?)`, created.UnixMicro()); err != nil {
		t.Fatal(err)
	}
	db.Close()

	ctx := context.Background()
	s, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if sb, err := s.GetSandbox(ctx, "oldrunning01"); err != nil || sb.Env["E"] != "1" {
		t.Errorf("sandbox after upgrade = %+v, %v", sb, err)
	}
	if sn, err := s.GetSnapshot(ctx, "key_a", "before"); err != nil || sn.SizeBytes != 42 {
		t.Errorf("snapshot after upgrade = %+v, %v", sn, err)
	}
	storetest.PutTemplateRecords(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = open(t, path)
	storetest.CheckTemplateRecords(t, s)
}

// TestMigrationBuildProgress upgrades a database at schema 6, whose build
// records had no start time nor step counts (the server read the log for
// them): they get their creation as start, and ready ones every step done.
func TestMigrationBuildProgress(t *testing.T) {
	path, db := oldDatabase(t, 6)
	created := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, b := range storetest.OldBuilds {
		if _, err := db.Exec(`INSERT INTO template_builds (id, template, owner, status, spec, reason, step, layers, config,
			node, created_at) VALUES (?, 'app', 'key_a', ?, ?, '', -1, '[]', '{}', 'n', ?)`,
			b.ID, b.Status, b.Spec, created.UnixMicro()); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()
	storetest.CheckUpgradedBuilds(t, open(t, path), created)
}
