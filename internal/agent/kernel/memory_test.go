package kernel_test

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agent/kernel"
	"github.com/kiln-sh/kiln/internal/agent/kernel/jupyter"
)

// Kernels are admitted while their estimated footprints fit under the
// memory limit less the headroom, counting kernels being started too:
// of two concurrent creates with room for one, one is refused with
// resource_exhausted, and the admitted context keeps working. Deleting a
// context makes room again, even while the sandbox's memory use still
// counts the deleted kernel for a moment (as gVisor's does).
func TestMemoryAdmission(t *testing.T) {
	_, o := newContexts(t) // skips without ipykernel
	const (
		mib      = int64(1 << 20)
		used     = 100 * mib // the sandbox's use besides the kernels
		headroom = 10 * mib
		python   = 100 * mib
	)
	var mu sync.Mutex
	var pids []int
	var deleted time.Time // the deleted kernel's memory shows free a second later
	c := kernel.NewContexts(kernel.Config{
		Factories: map[string]kernel.Factory{"python": jupyter.NewPython("/usr/bin/python3")},
		Memory: kernel.Memory{
			Limit: used + python + python/2 + headroom, Headroom: headroom,
			Usage: func() (int64, error) {
				mu.Lock()
				defer mu.Unlock()
				if !deleted.IsZero() && time.Since(deleted) < time.Second {
					return used + python, nil
				}
				return used, nil
			},
			Estimates: map[string]int64{"python": python},
			// The kernels report no RSS of their own: each counts at its
			// estimate.
			RSS: func(pid int) int64 {
				mu.Lock()
				pids = append(pids, pid)
				mu.Unlock()
				return 0
			},
		},
	})
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	created := make([]api.Context, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range created {
		wg.Go(func() { created[i], errs[i] = c.Create(ctx, "python", o) })
	}
	wg.Wait()
	var ok api.Context
	refused := 0
	for i, err := range errs {
		var ae *api.Error
		switch {
		case err == nil:
			ok = created[i]
		case asAPIError(err, &ae) && ae.Code == api.CodeResourceExhausted:
			refused++
		default:
			t.Fatalf("create %d: %v", i, err)
		}
	}
	if refused != 1 || ok.ID == "" {
		t.Fatalf("concurrent creates: %v; want one admitted and one refused", errs)
	}
	// The running kernel is counted (its RSS was read by pid).
	_, err := c.Create(ctx, "python", o)
	var ae *api.Error
	if !asAPIError(err, &ae) || ae.Code != api.CodeResourceExhausted {
		t.Fatalf("third create: %v; want resource_exhausted", err)
	}
	mu.Lock()
	if len(pids) == 0 || pids[0] <= 0 {
		t.Errorf("admission read no kernel's RSS (pids %v)", pids)
	}
	mu.Unlock()
	if out, _, err := execute(t, c, ok.ID, "print(6*7)", 0); err != nil || out != "42\n" {
		t.Fatalf("admitted context: %q, %v", out, err)
	}
	mu.Lock()
	deleted = time.Now()
	mu.Unlock()
	if err := c.Delete(ok.ID); err != nil {
		t.Fatal(err)
	}
	again, err := c.Create(ctx, "python", o)
	if err != nil {
		t.Fatalf("create after a delete: %v", err)
	}
	if out, _, err := execute(t, c, again.ID, "print(1)", 0); err != nil || out != "1\n" {
		t.Fatalf("new context: %q, %v", out, err)
	}
	// A default context's lazily started kernel is admitted too.
	d, err := c.Default("python", o)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := execute(t, c, d.ID, "1", 0); !asAPIError(err, &ae) || ae.Code != api.CodeResourceExhausted {
		t.Fatalf("default context's first execution: %v; want resource_exhausted", err)
	}
}

// TreeRSS finds a real process's resident memory, with its children's.
func TestTreeRSS(t *testing.T) {
	self := kernel.TreeRSS(os.Getpid())
	if self <= 0 {
		t.Fatalf("TreeRSS(self) = %d", self)
	}
	if n := kernel.TreeRSS(1 << 30); n != 0 {
		t.Errorf("TreeRSS of no process = %d", n)
	}
}

func asAPIError(err error, target **api.Error) bool { return errors.As(err, target) }
