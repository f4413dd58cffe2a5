package server_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-sh/kiln/internal/rootfs"
	"github.com/kiln-sh/kiln/internal/volume"
)

// newVolumes is the harness's volume manager in dir with quota per key
// (nil if quota is 0). Its volumes are unmounted and removed when the
// test ends, after its sandboxes are gone.
func newVolumes(t testing.TB, dir string, st volume.Store, quota int64) *volume.Manager {
	t.Helper()
	if quota == 0 {
		return nil
	}
	vm, err := volume.New(volume.Config{Dir: dir, Store: st, Quota: quota})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if err := rootfs.Unmount(context.Background(), filepath.Join(dir, e.Name())); err != nil {
				t.Errorf("removing volume %s: %v", e.Name(), err)
			}
		}
	})
	return vm
}
