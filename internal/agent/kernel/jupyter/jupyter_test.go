package jupyter

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agent/kernel"
)

// testPython is the interpreter with ipykernel: on CI hosts python3 on
// PATH may be another one (pyenv) without it.
const testPython = "/usr/bin/python3"

// need skips the test unless probe succeeds, or fails it on CI.
func need(t *testing.T, what string, probe ...string) {
	t.Helper()
	if err := exec.Command(probe[0], probe[1:]...).Run(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not installed (scripts/setup-deps.sh): %v", what, err)
		}
		t.Skipf("%s is not installed (scripts/setup-deps.sh installs it): %v", what, err)
	}
}

func testOptions(t *testing.T) kernel.Options {
	return kernel.Options{Cwd: t.TempDir(), Env: []string{"PATH=/usr/bin:/bin", "HOME=" + t.TempDir(), "LANG=C.UTF-8"},
		UID: uint32(os.Getuid()), GID: uint32(os.Getgid())}
}

func startPython(t *testing.T) *Kernel {
	t.Helper()
	need(t, "python3-ipykernel", testPython, "-c", "import ipykernel, matplotlib_inline")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	start := time.Now()
	k, err := Start(ctx, PythonSpec(testPython), testOptions(t))
	if err != nil {
		t.Fatalf("starting python kernel: %v", err)
	}
	t.Logf("python kernel started in %s", time.Since(start))
	t.Cleanup(func() { k.Close() })
	return k
}

// outcome is what one execution produced.
type outcome struct {
	stdout, stderr string
	results        []api.Result
	errs           []api.ExecutionError
	count          int
	err            error
}

func (o outcome) main() string {
	for _, r := range o.results {
		if r.IsMainResult {
			return r.Data["text/plain"]
		}
	}
	return ""
}

func run(t *testing.T, k kernel.Kernel, code string, env map[string]string, timeout time.Duration) outcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), cmpOr(timeout, 60*time.Second))
	defer cancel()
	var o outcome
	var out, errb strings.Builder
	o.count, o.err = k.Execute(ctx, code, env, func(ev api.Event) error {
		switch ev.Type {
		case api.EventStdout:
			out.Write(ev.Data)
		case api.EventStderr:
			errb.Write(ev.Data)
		case api.EventResult:
			o.results = append(o.results, *ev.Result)
		case api.EventExecutionError:
			o.errs = append(o.errs, *ev.ExecutionError)
		}
		return nil
	})
	o.stdout, o.stderr = out.String(), errb.String()
	return o
}

func cmpOr(a, b time.Duration) time.Duration {
	if a != 0 {
		return a
	}
	return b
}

func TestPython(t *testing.T) {
	k := startPython(t)
	tests := []struct {
		name  string
		code  string
		env   map[string]string
		check func(t *testing.T, o outcome)
	}{
		{"variables persist", "x = 41", nil, func(t *testing.T, o outcome) {
			if o.err != nil || len(o.errs) > 0 {
				t.Fatalf("err %v %v", o.err, o.errs)
			}
		}},
		{"value of the last expression", "x + 1", nil, func(t *testing.T, o outcome) {
			if o.main() != "42" {
				t.Fatalf("main result %q, want 42 (%+v)", o.main(), o)
			}
		}},
		{"stdout and stderr", "import sys\nprint('out')\nprint('err', file=sys.stderr)", nil, func(t *testing.T, o outcome) {
			if o.stdout != "out\n" || o.stderr != "err\n" {
				t.Fatalf("stdout %q stderr %q", o.stdout, o.stderr)
			}
		}},
		{"unicode", "print('héllo wörld 🚀 日本語')", nil, func(t *testing.T, o outcome) {
			if o.stdout != "héllo wörld 🚀 日本語\n" {
				t.Fatalf("stdout %q", o.stdout)
			}
		}},
		{"binary garbage", "import os, sys\nsys.stdout.flush()\nos.write(1, bytes(range(256)))\nprint(b'\\xff\\xfe'.decode('utf-8', 'surrogateescape'))", nil,
			func(t *testing.T, o outcome) {
				if o.err != nil {
					t.Fatal(o.err)
				}
			}},
		{"exception", "def f():\n    1/0\nf()", nil, func(t *testing.T, o outcome) {
			if len(o.errs) != 1 {
				t.Fatalf("errors %+v", o.errs)
			}
			e := o.errs[0]
			if e.Name != "ZeroDivisionError" || e.Value != "division by zero" || !strings.Contains(e.Traceback, "1/0") ||
				strings.Contains(e.Traceback, "\x1b[") {
				t.Fatalf("error %+v", e)
			}
		}},
		{"works after an exception", "x", nil, func(t *testing.T, o outcome) {
			if o.main() != "41" {
				t.Fatalf("main result %q", o.main())
			}
		}},
		{"dataframe", "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})", nil, func(t *testing.T, o outcome) {
			if len(o.results) != 1 || !strings.Contains(o.results[0].Data["text/html"], "<table") ||
				!strings.Contains(o.results[0].Data["text/plain"], "a  b") {
				t.Fatalf("results %+v errs %+v", o.results, o.errs)
			}
		}},
		{"matplotlib figure without show", "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])", nil, func(t *testing.T, o outcome) {
			var pngs []string
			for _, r := range o.results {
				if p, ok := r.Data["image/png"]; ok {
					pngs = append(pngs, p)
				}
			}
			if len(pngs) != 1 {
				t.Fatalf("%d image/png results, want 1: %+v %+v %q", len(pngs), o.results, o.errs, o.stderr)
			}
			b, err := base64.StdEncoding.DecodeString(pngs[0])
			if err != nil {
				t.Fatal(err)
			}
			img, err := png.Decode(bytes.NewReader(b))
			if err != nil {
				t.Fatalf("decoding png: %v", err)
			}
			if img.Bounds().Dx() < 100 {
				t.Fatalf("image %v", img.Bounds())
			}
		}},
		{"per-execution env", "import os\nprint(os.environ.get('KILN_A'), os.environ.get('HOME') == 'x\"y\\'z\\n')",
			map[string]string{"KILN_A": "é 1", "HOME": "x\"y'z\n"}, func(t *testing.T, o outcome) {
				if o.stdout != "é 1 True\n" {
					t.Fatalf("stdout %q errs %+v err %v", o.stdout, o.errs, o.err)
				}
			}},
		{"env restored", "import os\nprint(os.environ.get('KILN_A'), os.environ.get('HOME') != 'x')", nil, func(t *testing.T, o outcome) {
			if o.stdout != "None True\n" {
				t.Fatalf("stdout %q", o.stdout)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.check(t, run(t, k, tt.code, tt.env, 0)) })
	}
}

func TestPythonInterrupt(t *testing.T) {
	k := startPython(t)
	run(t, k, "y = 7", nil, 0)
	// Interrupt once the loop really runs: on a loaded machine a fixed
	// deadline can fire before the kernel has even started the cell.
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	var errs []api.ExecutionError
	_, err := k.Execute(ctx, "print('looping', flush=True)\nwhile True: pass", nil, func(ev api.Event) error {
		switch ev.Type {
		case api.EventStdout:
			if strings.Contains(string(ev.Data), "looping") {
				time.AfterFunc(200*time.Millisecond, func() { cancel(context.DeadlineExceeded) })
			}
		case api.EventExecutionError:
			errs = append(errs, *ev.ExecutionError)
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want the cancellation", err)
	}
	if len(errs) != 1 || errs[0].Name != "KeyboardInterrupt" {
		t.Errorf("errors %+v", errs)
	}
	if o := run(t, k, "y * 6", nil, 0); o.main() != "42" {
		t.Fatalf("after interrupt: %+v", o)
	}
}

func TestPythonDeath(t *testing.T) {
	k := startPython(t)
	run(t, k, "z = 1", nil, 0)
	o := run(t, k, "print('bye', flush=True)\nimport os; os._exit(1)", nil, 0)
	if !errors.Is(o.err, kernel.ErrDied) || !strings.Contains(o.err.Error(), "exit code 1") {
		t.Fatalf("err %v", o.err)
	}
	o = run(t, k, "print('z' in globals())", nil, 0)
	if o.err != nil || o.stdout != "False\n" {
		t.Fatalf("after death: %+v", o)
	}
}

func TestPythonHugeOutput(t *testing.T) {
	k := startPython(t)
	o := run(t, k, "print('x' * 50_000_000)", nil, 0)
	if o.err != nil {
		t.Fatal(o.err)
	}
	if len(o.stdout) > maxMessage || len(o.stdout) < 1<<20 || strings.Trim(o.stdout, "x") != "" || !strings.Contains(o.stderr, "[kiln:") {
		t.Fatalf("stdout %d bytes, stderr %q", len(o.stdout), o.stderr)
	}
	if o := run(t, k, "print(1)", nil, 0); o.stdout != "1\n" {
		t.Fatalf("after huge output: %+v", o)
	}
}

func TestR(t *testing.T) {
	need(t, "r-cran-irkernel", "R", "--slave", "-e", "library(IRkernel)")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	start := time.Now()
	k, err := Start(ctx, RSpec("R"), testOptions(t))
	if err != nil {
		t.Fatalf("starting R kernel: %v", err)
	}
	t.Logf("R kernel started in %s", time.Since(start))
	defer k.Close()
	if o := run(t, k, "x <- 41", nil, 0); o.err != nil || len(o.errs) > 0 {
		t.Fatalf("%+v", o)
	}
	// IRkernel sends a visible value as display_data, not execute_result.
	if o := run(t, k, "x + 1", nil, 0); len(o.results) != 1 || o.results[0].Data["text/plain"] != "[1] 42" {
		t.Fatalf("%+v", o)
	}
	if o := run(t, k, `cat(Sys.getenv("KILN_R"))`, map[string]string{"KILN_R": "a'b\"c"}, 0); o.stdout != `a'b"c` {
		t.Fatalf("env: %+v", o)
	}
	if o := run(t, k, `stop("boom")`, nil, 0); len(o.errs) != 1 || !strings.Contains(o.errs[0].Value, "boom") {
		t.Fatalf("error: %+v", o)
	}
}

// A kernel that cannot start fails its Start with the reason and leaves
// nothing behind; it used to panic (stopping a nil instance), which as
// the agent's call killed the sandbox. Each case fails at another step.
func TestStartFailures(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp) // where kernel directories are made
	noEntry := t.TempDir()
	tests := []struct {
		name string
		spec Spec
		opts func(kernel.Options) kernel.Options
		want string
	}{
		{"cwd missing", PythonSpec("/bin/true"), func(o kernel.Options) kernel.Options {
			o.Cwd = noEntry + "/gone"
			return o
		}, "no such file"},
		{"interpreter exits", PythonSpec("/bin/false"), nil, "exit code 1"},
		{"interpreter missing", PythonSpec("/nonexistent/python3"), nil, "not exist"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := testOptions(t)
			if tt.opts != nil {
				o = tt.opts(o)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			k, err := Start(ctx, tt.spec, o)
			if err == nil {
				k.Close()
				t.Fatal("started")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q, want it to mention %q", err, tt.want)
			}
		})
	}
	// No kernel directory is left behind.
	if left, _ := filepath.Glob(filepath.Join(tmp, "kiln-kernel-*")); len(left) > 0 {
		t.Errorf("left %v behind", left)
	}
}
