package kernel_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agent/kernel"
	"github.com/kiln-sh/kiln/internal/agent/kernel/jupyter"
)

func newContexts(t *testing.T) (*kernel.Contexts, kernel.Options) {
	t.Helper()
	if err := exec.Command("/usr/bin/python3", "-c", "import ipykernel").Run(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("python3-ipykernel is not installed: %v", err)
		}
		t.Skipf("python3-ipykernel is not installed (scripts/setup-deps.sh installs it): %v", err)
	}
	c := kernel.NewContexts(kernel.Config{Factories: map[string]kernel.Factory{"python": jupyter.NewPython("/usr/bin/python3")}})
	t.Cleanup(func() { c.Close() })
	o := kernel.Options{Cwd: t.TempDir(), Env: []string{"PATH=/usr/bin:/bin", "HOME=" + t.TempDir()},
		UID: uint32(os.Getuid()), GID: uint32(os.Getgid())}
	return c, o
}

func execute(t *testing.T, c *kernel.Contexts, id, code string, timeout time.Duration) (string, []api.Event, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out strings.Builder
	var evs []api.Event
	_, err := c.Execute(ctx, id, code, nil, timeout, func(ev api.Event) error {
		evs = append(evs, ev)
		if ev.Type == api.EventStdout {
			out.Write(ev.Data)
		}
		return nil
	})
	return out.String(), evs, err
}

func TestCanonical(t *testing.T) {
	tests := []struct{ in, want string }{
		{"python", "python"}, {"py", "python"}, {"Python3", "python"}, {"r", "r"}, {"js", "javascript"},
		{"ts", "typescript"}, {"TypeScript", "typescript"}, {"node", "javascript"}, {"sh", "bash"}, {"shell", "bash"}, {"c++", "cpp"},
		{"go", "go"}, {"rust", "rust"}, {"java", "java"}, {"c", "c"}, {"cobol", ""},
	}
	for _, tt := range tests {
		got, err := kernel.Canonical(tt.in)
		if got != tt.want {
			t.Errorf("Canonical(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
		var ae *api.Error
		if tt.want == "" && (!errors.As(err, &ae) || ae.Code != api.CodeInvalidArgument || !strings.Contains(ae.Message, "python, r, javascript, typescript")) {
			t.Errorf("Canonical(%q) error %v", tt.in, err)
		}
	}
}

func TestContexts(t *testing.T) {
	c, o := newContexts(t)
	ctx := context.Background()
	a, err := c.Create(ctx, "py", o)
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Create(ctx, "python", o)
	if err != nil {
		t.Fatal(err)
	}
	if a.ID == b.ID || a.Language != "python" {
		t.Fatalf("contexts %+v %+v", a, b)
	}
	execute(t, c, a.ID, "v = 'a'", 0)
	execute(t, c, b.ID, "v = 'b'", 0)
	if out, _, _ := execute(t, c, a.ID, "print(v)", 0); out != "a\n" {
		t.Errorf("context a sees %q", out)
	}
	if out, _, _ := execute(t, c, b.ID, "print(v)", 0); out != "b\n" {
		t.Errorf("context b sees %q", out)
	}

	t.Run("serialized in order", func(t *testing.T) {
		execute(t, c, a.ID, "seen = []", 0)
		var wg sync.WaitGroup
		for i := range 5 {
			wg.Go(func() { execute(t, c, a.ID, "import time; time.sleep(0.1); seen.append("+string(rune('0'+i))+")", 0) })
			time.Sleep(30 * time.Millisecond) // arrive in order
		}
		wg.Wait()
		if out, _, _ := execute(t, c, a.ID, "print(seen)", 0); out != "[0, 1, 2, 3, 4]\n" {
			t.Errorf("order %q", out)
		}
	})
	t.Run("parallel across contexts", func(t *testing.T) {
		start := time.Now()
		var wg sync.WaitGroup
		for _, id := range []string{a.ID, b.ID} {
			wg.Go(func() { execute(t, c, id, "import time; time.sleep(1)", 0) })
		}
		wg.Wait()
		if d := time.Since(start); d > 1800*time.Millisecond {
			t.Errorf("two 1 s executions in two contexts took %s", d)
		}
	})
	t.Run("timeout interrupts and the context survives", func(t *testing.T) {
		_, _, err := execute(t, c, a.ID, "while True: pass", 2*time.Second)
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Code != api.CodeDeadlineExceeded {
			t.Fatalf("err %v", err)
		}
		if out, _, _ := execute(t, c, a.ID, "print(v)", 0); out != "a\n" {
			t.Errorf("after timeout %q", out)
		}
	})
	t.Run("a dead kernel is reported and restarted", func(t *testing.T) {
		_, evs, err := execute(t, c, b.ID, "import os; os._exit(1)", 0)
		if err != nil || len(evs) == 0 || evs[len(evs)-1].ExecutionError == nil || evs[len(evs)-1].ExecutionError.Name != "KernelDied" {
			t.Fatalf("err %v events %+v", err, evs)
		}
		if out, _, err := execute(t, c, b.ID, "print('v' in globals())", 0); out != "False\n" {
			t.Errorf("after death %q %v", out, err)
		}
	})
	t.Run("restart loses state", func(t *testing.T) {
		if _, err := c.Restart(ctx, a.ID); err != nil {
			t.Fatal(err)
		}
		if out, _, _ := execute(t, c, a.ID, "print('v' in globals())", 0); out != "False\n" {
			t.Errorf("after restart %q", out)
		}
	})
	t.Run("default context", func(t *testing.T) {
		if m, ok := c.Made("python"); ok {
			t.Fatalf("a default context before any: %+v", m)
		}
		d1, err := c.Default("python3", o)
		if err != nil {
			t.Fatal(err)
		}
		d2, _ := c.Default("py", o)
		if d1.ID != d2.ID {
			t.Fatalf("two default contexts %s %s", d1.ID, d2.ID)
		}
		if m, ok := c.Made("py"); !ok || m.ID != d1.ID {
			t.Fatalf("made default context %+v %v, want %s", m, ok, d1.ID)
		}
		if out, _, err := execute(t, c, d1.ID, "print(1)", 0); out != "1\n" {
			t.Fatalf("%q %v", out, err)
		}
		if len(c.List()) != 3 {
			t.Fatalf("list %+v", c.List())
		}
	})
	t.Run("delete", func(t *testing.T) {
		if err := c.Delete(b.ID); err != nil {
			t.Fatal(err)
		}
		_, _, err := execute(t, c, b.ID, "1", 0)
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Code != api.CodeNotFound {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("output cap", func(t *testing.T) {
		out, evs, err := execute(t, c, a.ID, "for _ in range(40): print('y' * 1_000_000)", 0)
		if err != nil {
			t.Fatal(err)
		}
		last := evs[len(evs)-1]
		if len(out) > kernel.DefaultOutputLimit || !strings.Contains(string(last.Data), "output exceeded") {
			t.Fatalf("stdout %d bytes, last event %q", len(out), last.Data)
		}
	})
}

// Queue returns at once, yet its code runs before any execution sent
// after it; its failure reaches done, its output nobody.
func TestQueue(t *testing.T) {
	c, o := newContexts(t)
	ctx := context.Background()
	a, err := c.Default("python", o)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 2)
	if err := c.Queue(ctx, a.ID, "import time; time.sleep(0.3); print('hidden'); queued = 1", time.Minute, func(err error) { done <- err }); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		t.Fatalf("Queue waited for its code: %v", err)
	default:
	}
	if out, _, err := execute(t, c, a.ID, "print(queued)", 0); err != nil || out != "1\n" {
		t.Errorf("execution after Queue: %q %v", out, err)
	}
	if err := <-done; err != nil {
		t.Errorf("queued code: %v", err)
	}
	if err := c.Queue(ctx, a.ID, "raise ValueError('boom')", time.Minute, func(err error) { done <- err }); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err == nil || !strings.Contains(err.Error(), "ValueError: boom") {
		t.Errorf("failing queued code: %v", err)
	}
	if err := c.Queue(ctx, "nope", "1", 0, func(error) {}); err == nil {
		t.Error("Queue into a missing context succeeded")
	}
}

// TestStartOutlivesCaller: a caller that gives up while its context's
// kernel starts (a client's timeout on a loaded host) does not waste the
// start: the next execution finds that kernel up instead of starting
// another.
func TestStartOutlivesCaller(t *testing.T) {
	_, o := newContexts(t)
	python := jupyter.NewPython("/usr/bin/python3")
	var starts atomic.Int32
	c := kernel.NewContexts(kernel.Config{Factories: map[string]kernel.Factory{
		"python": func(ctx context.Context, o kernel.Options) (kernel.Kernel, error) {
			starts.Add(1)
			time.Sleep(200 * time.Millisecond) // the caller gives up meanwhile
			return python(ctx, o)
		}}})
	t.Cleanup(func() { c.Close() })
	d, err := c.Default("python", o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := c.Execute(ctx, d.ID, "x = 1", nil, 0, func(api.Event) error { return nil }); err == nil {
		t.Fatal("an execution whose caller gave up during the start succeeded")
	}
	if out, _, err := execute(t, c, d.ID, "print(6 * 7)", 0); err != nil || out != "42\n" {
		t.Fatalf("execution after the abandoned one: %q %v", out, err)
	}
	if n := starts.Load(); n != 1 {
		t.Errorf("the kernel was started %d times, want once", n)
	}
}
