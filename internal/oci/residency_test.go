package oci

import (
	"context"
	"crypto/rand"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kiln-sh/kiln/internal/oci/ocitest"
)

// writePages writes a 4 MiB pages file into dir and returns its path.
func writePages(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, pagesFile)
	b := make([]byte, 4<<20)
	rand.Read(b)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// directDir is a temporary dir on a file system with O_DIRECT (the test
// skips without one: RestoreDirect then always answers false).
func directDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	f, err := os.OpenFile(filepath.Join(dir, "probe"), os.O_CREATE|os.O_RDWR|unix.O_DIRECT, 0o600)
	if err != nil {
		t.Skipf("%s has no O_DIRECT: %v", dir, err)
	}
	f.Close()
	return dir
}

// warm reads the file through the page cache.
func warm(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := io.Copy(io.Discard, f); err != nil {
		t.Fatal(err)
	}
}

func TestRestoreDirect(t *testing.T) {
	dir := directDir(t)
	path := writePages(t, dir)
	tests := []struct {
		name    string
		prepare func()
		want    bool
	}{
		{"cold image", func() { ocitest.DropFromPageCache(t, path) }, true},
		{"hot image", func() { warm(t, path) }, false},
		{"cold again", func() { ocitest.DropFromPageCache(t, path) }, true},
		{"no pages file", func() { os.Remove(path) }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.prepare()
			if got := RestoreDirect(dir); got != tt.want {
				r, n, err := residency(path)
				t.Errorf("restoreDirect = %v, want %v (resident %d of %d pages, %v)", got, tt.want, r, n, err)
			}
		})
	}
}

func TestResidencyEmptyFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, pagesFile), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if RestoreDirect(dir) {
		t.Error("an empty pages file asks for O_DIRECT")
	}
}

// Restore asks runsc for --direct exactly when the image is cold (a fake
// runsc records its arguments).
func TestRestorePassesDirect(t *testing.T) {
	dir := directDir(t)
	img := filepath.Join(dir, "img")
	if err := os.Mkdir(img, 0o700); err != nil {
		t.Fatal(err)
	}
	path := writePages(t, img)
	argsFile := filepath.Join(dir, "args")
	bin := filepath.Join(dir, "runsc")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho \"$@\" > "+argsFile+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	c := Runsc(Config{Binary: bin, Root: filepath.Join(dir, "root")})
	b := &Bundle{Dir: filepath.Join(dir, "bundle")}
	if err := os.Mkdir(b.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name    string
		prepare func()
		direct  bool
	}{
		{"cold", func() { ocitest.DropFromPageCache(t, path) }, true},
		{"hot", func() { warm(t, path) }, false},
	} {
		tt.prepare()
		if err := c.Restore(context.Background(), "sb1", b, img, IO{}); err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		got, err := os.ReadFile(argsFile)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(got), " --direct ") != tt.direct || !strings.HasSuffix(strings.TrimSpace(string(got)), " sb1") {
			t.Errorf("%s image: runsc %s", tt.name, got)
		}
	}
}
