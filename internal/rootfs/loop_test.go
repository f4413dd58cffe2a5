package rootfs

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TestAttachLoopConcurrent: many attachers at once (each is handed the
// same free device by the kernel, and one wins it) all get a device of
// their own, as 200 creates across 3 nodes on one host need
// (BenchmarkCluster saw "device or resource busy" with 16 immediate
// retries).
func TestAttachLoopConcurrent(t *testing.T) {
	requireRoot(t)
	const n = 48
	dir := t.TempDir()
	devs := make([]*os.File, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		img := filepath.Join(dir, fmt.Sprintf("img%d", i))
		if err := os.WriteFile(img, make([]byte, 1<<20), 0o600); err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			<-start
			devs[i], errs[i] = attachLoop(img)
		})
	}
	began := time.Now()
	close(start)
	wg.Wait()
	t.Logf("%d loop devices attached at once in %v", n, time.Since(began).Round(time.Microsecond))
	seen := map[string]bool{}
	for i, d := range devs {
		if errs[i] != nil {
			t.Errorf("attacher %d: %v", i, errs[i])
			continue
		}
		if seen[d.Name()] {
			t.Errorf("%s attached twice", d.Name())
		}
		seen[d.Name()] = true
		if err := detachLoop(d.Name()); err != nil {
			t.Error(err)
		}
		d.Close()
	}
}
