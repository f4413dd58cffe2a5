package storetest

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// ApplyMigrations runs the first version migrations of the test's package
// (migrations/*.sql, in order) with exec, as a Kiln at that schema left
// its database, and returns how many migrations there are in all.
func ApplyMigrations(t *testing.T, version int, exec func(body string) error) int {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("migrations", "*.sql"))
	if err != nil || len(files) <= version {
		t.Fatalf("migrations: %v, %v; want more than %d", files, err, version)
	}
	slices.Sort(files)
	for _, f := range files[:version] {
		body, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := exec(string(body)); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
	return len(files)
}
