package repl

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agent/kernel"
)

// outcome is what one execution produced.
type outcome struct {
	stdout, stderr string
	results        []map[string]string
	err            *api.ExecutionError
	count          int
	runErr         error
	elapsed        time.Duration
	firstOut       time.Duration // when the first stdout arrived
}

// cell is one step of a table: code and what it must produce.
type cell struct {
	name      string
	code      string
	env       map[string]string
	timeout   time.Duration
	stdout    string // exact, unless "*" (ignored)
	stderr    string // substring
	result    string // text/plain of the main result; "" for none
	errName   string
	errValue  string // substring
	traceback string // substring
	ctxErr    bool
}

func start(t *testing.T, f kernel.Factory, tool string) kernel.Kernel {
	t.Helper()
	if _, err := exec.LookPath(tool); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is required in CI: %v", tool, err)
		}
		t.Skipf("%s not installed: %v", tool, err)
	}
	k, err := f(context.Background(), kernel.Options{Cwd: t.TempDir(), Env: os.Environ()})
	if err != nil {
		t.Fatalf("starting kernel: %v", err)
	}
	t.Cleanup(func() { k.Close() })
	return k
}

func execute(t *testing.T, k kernel.Kernel, code string, env map[string]string, timeout time.Duration) outcome {
	t.Helper()
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var o outcome
	var out, errb strings.Builder
	t0 := time.Now()
	o.count, o.runErr = k.Execute(ctx, code, env, func(ev api.Event) error {
		switch ev.Type {
		case api.EventStdout:
			if out.Len() == 0 {
				o.firstOut = time.Since(t0)
			}
			out.Write(ev.Data)
		case api.EventStderr:
			errb.Write(ev.Data)
		case api.EventResult:
			o.results = append(o.results, ev.Result.Data)
		case api.EventExecutionError:
			o.err = ev.ExecutionError
		}
		return nil
	})
	o.elapsed = time.Since(t0)
	o.stdout, o.stderr = out.String(), errb.String()
	return o
}

// check runs the cells in order on one kernel: later cells see the state
// earlier ones left.
func check(t *testing.T, k kernel.Kernel, cells []cell) {
	t.Helper()
	for _, c := range cells {
		o := execute(t, k, c.code, c.env, c.timeout)
		if c.ctxErr != errors.Is(o.runErr, context.DeadlineExceeded) || (!c.ctxErr && o.runErr != nil) {
			t.Fatalf("%s: Execute error = %v, want deadline exceeded: %v", c.name, o.runErr, c.ctxErr)
		}
		if c.stdout != "*" && o.stdout != c.stdout {
			t.Errorf("%s: stdout = %q, want %q", c.name, o.stdout, c.stdout)
		}
		if !strings.Contains(o.stderr, c.stderr) {
			t.Errorf("%s: stderr = %q, want it to contain %q", c.name, o.stderr, c.stderr)
		}
		var res string
		for _, r := range o.results {
			res = r["text/plain"]
		}
		if res != c.result {
			t.Errorf("%s: result = %q, want %q", c.name, res, c.result)
		}
		var name, value, tb string
		if o.err != nil {
			name, value, tb = o.err.Name, o.err.Value, o.err.Traceback
		}
		if name != c.errName || !strings.Contains(value, c.errValue) || !strings.Contains(tb, c.traceback) {
			t.Errorf("%s: error = %q %q %q, want %q %q %q", c.name, name, value, tb, c.errName, c.errValue, c.traceback)
		}
		if c.ctxErr && o.elapsed > c.timeout+3*time.Second {
			t.Errorf("%s: interrupt took %v", c.name, o.elapsed)
		}
	}
}

// bigOutput checks that n bytes of output stream through without the
// kernel buffering them (the test consumes them as they come).
func bigOutput(t *testing.T, k kernel.Kernel, code string, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	total, maxChunk := 0, 0
	_, err := k.Execute(ctx, code, nil, func(ev api.Event) error {
		if ev.Type == api.EventStdout {
			total += len(ev.Data)
			maxChunk = max(maxChunk, len(ev.Data))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Execute: %v", err)
	}
	if total != n {
		t.Errorf("got %d bytes of stdout, want %d", total, n)
	}
	if maxChunk > 1<<20 {
		t.Errorf("largest chunk %d bytes: output is buffered", maxChunk)
	}
}
