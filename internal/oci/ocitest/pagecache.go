package ocitest

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// DropFromPageCache writes the file at path back to disk and evicts it
// from the host's page cache, as a long-unused checkpoint image would be.
func DropFromPageCache(t testing.TB, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
}
