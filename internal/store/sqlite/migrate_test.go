package sqlite_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/internal/sandbox"
)

// TestMigrationRetention upgrades a database at schema 3 holding an ended
// sandbox with env and metadata, as an older Kiln left it: the upgrade
// turns it into a tombstone that ended when it was created (so a
// retention run can delete it), and leaves a live one alone.
func TestMigrationRetention(t *testing.T) {
	path := filepath.Join(t.TempDir(), "old.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, f := range []string{"0001_init.sql", "0002_snapshots.sql", "0003_auto_resume.sql"} {
		body, err := os.ReadFile(filepath.Join("migrations", f))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(string(body)); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
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
	if _, err := db.Exec(`CREATE TABLE schema_version (version INTEGER NOT NULL) STRICT; INSERT INTO schema_version VALUES (3)`); err != nil {
		t.Fatal(err)
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
