// Package ocitest holds helpers for tests that run real sandboxes.
package ocitest

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/rootfs"
	"github.com/kiln-sh/kiln/internal/template"
)

// Rootfs returns a root filesystem dir for tests: $KILN_TEST_ROOTFS if
// set, else the bottom layer (Debian, made by debootstrap) of the base
// template that make setup builds in the data dir, else "".
func Rootfs() string {
	if p := os.Getenv("KILN_TEST_ROOTFS"); p != "" {
		return p
	}
	t, err := template.Lookup(config.FromEnv().DataDir, "base")
	if err != nil {
		return ""
	}
	p := t.Rootfs
	if len(t.Layers) > 0 {
		p = t.Layers[0]
	}
	if _, err := os.Stat(filepath.Join(p, "bin")); err != nil {
		return ""
	}
	return p
}

// Require skips the test with reason unless ok; with CI=true it fails
// instead, so CI cannot go green by skipping.
func Require(t testing.TB, ok bool, reason string) {
	t.Helper()
	if ok {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s (CI=true: not skipping)", reason)
	}
	t.Skip(reason)
}

// RequireRoot skips unless running as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	Require(t, os.Geteuid() == 0, "needs root")
}

// RequireRootfs returns Rootfs(), skipping if there is none.
func RequireRootfs(t testing.TB) string {
	t.Helper()
	p := Rootfs()
	Require(t, p != "", "no template rootfs: set KILN_TEST_ROOTFS")
	return p
}

// Layer mounts a writable layer of size bytes over the template rootfs in a
// temp dir and returns the overlay's path; it is unmounted on cleanup.
func Layer(t testing.TB, size int64) string {
	t.Helper()
	RequireRoot(t)
	lower := RequireRootfs(t)
	dir := filepath.Join(t.TempDir(), "layer")
	l, err := rootfs.Mount(context.Background(), lower, dir, size)
	if err != nil {
		t.Fatalf("mounting layer: %v", err)
	}
	t.Cleanup(func() {
		if err := rootfs.Unmount(context.Background(), dir); err != nil {
			t.Errorf("unmounting layer: %v", err)
		}
	})
	return l.Rootfs()
}
