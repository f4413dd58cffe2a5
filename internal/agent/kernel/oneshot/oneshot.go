// Package oneshot runs compiled languages (Go, Rust, C, C++, Java) as
// compile-and-run kernels: each execution writes the cell to a fresh
// temporary directory, compiles it and runs the program. Nothing persists
// between executions except the execution count and the toolchains' own
// caches (Go's build cache), so every cell must be a whole program.
package oneshot

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agent/kernel"
)

var _ kernel.Kernel = (*Kernel)(nil)

var errClosed = errors.New("kernel closed")

// compileOutputLimit caps the compiler output kept for an error report.
const compileOutputLimit = 1 << 20

// toolchain says how to build and run one language.
type toolchain struct {
	// source names the source file for code.
	source func(code string) string
	// compile and run give the argv of the two steps, run in the
	// temporary directory.
	compile func(src string) []string
	run     func(src string) []string
	// env adds variables the steps need unless the user set them.
	env func(o kernel.Options) []string
	// snippet, if set, turns a cell into the program to compile, and
	// says whether the program writes a result (see javaSnippet).
	snippet func(code string, asStatement bool) (program string, result bool)
}

var javaPublicClass = regexp.MustCompile(`(?m)^\s*public\s+(?:(?:final|abstract|strictfp)\s+)*class\s+([A-Za-z_$][A-Za-z0-9_$]*)`)

var toolchains = map[string]toolchain{
	"go": {
		source:  fixed("main.go"),
		compile: func(src string) []string { return []string{"go", "build", "-o", "prog", src} },
		run:     prog,
		env:     goEnv,
	},
	"rust": {
		// A debug build: rustc -O costs more compile time than it saves
		// for typical cells.
		source:  fixed("main.rs"),
		compile: func(src string) []string { return []string{"rustc", "--edition", "2021", "-o", "prog", src} },
		run:     prog,
	},
	"c": {
		source:  fixed("main.c"),
		compile: func(src string) []string { return []string{"gcc", "-O1", "-o", "prog", src, "-lm"} },
		run:     prog,
	},
	"cpp": {
		source:  fixed("main.cpp"),
		compile: func(src string) []string { return []string{"g++", "-O1", "-o", "prog", src} },
		run:     prog,
	},
	"java": {
		// The public class must live in a file of its name; without one
		// the program's class is Main.
		source: func(code string) string {
			if m := javaPublicClass.FindStringSubmatch(code); m != nil {
				return m[1] + ".java"
			}
			return "Main.java"
		},
		snippet: javaSnippet,
		compile: func(src string) []string { return []string{"javac", "-encoding", "UTF-8", "-d", ".", src} },
		run: func(src string) []string {
			return []string{"java", "-Dfile.encoding=UTF-8", "-Dstdout.encoding=UTF-8", "-XX:+UseSerialGC",
				"-XX:TieredStopAtLevel=1", "-cp", ".", strings.TrimSuffix(src, ".java")}
		},
	},
}

func fixed(name string) func(string) string { return func(string) string { return name } }
func prog(string) []string                  { return []string{"./prog"} }

// goEnv keeps Go's build cache across executions (a cold build of the
// standard library packages costs seconds) and never downloads toolchains.
func goEnv(o kernel.Options) []string {
	env := []string{"GOTOOLCHAIN=local", "GOFLAGS=-buildvcs=false"}
	home := getenv(o.Env, "HOME")
	if getenv(o.Env, "GOCACHE") == "" {
		dir := filepath.Join(os.TempDir(), fmt.Sprintf("kiln-gocache-%d", o.UID))
		if home != "" {
			dir = filepath.Join(home, ".cache", "go-build")
		}
		env = append(env, "GOCACHE="+dir)
	}
	if getenv(o.Env, "GOPATH") == "" && home == "" {
		env = append(env, "GOPATH="+filepath.Join(os.TempDir(), fmt.Sprintf("kiln-gopath-%d", o.UID)))
	}
	return env
}

// Languages lists the languages New accepts.
func Languages() []string { return []string{"c", "cpp", "go", "java", "rust"} }

// New returns the factory of the compile-and-run kernel for language: one
// of Languages(). The kernel starts nothing until the first execution; a
// missing toolchain shows then, as an execution error.
func New(language string) kernel.Factory {
	return func(ctx context.Context, o kernel.Options) (kernel.Kernel, error) {
		tc, ok := toolchains[language]
		if !ok {
			return nil, fmt.Errorf("unsupported language %q", language)
		}
		return &Kernel{lang: language, tc: tc, opts: o}, nil
	}
}

// Kernel compiles and runs each cell as a program.
type Kernel struct {
	lang string
	tc   toolchain
	opts kernel.Options

	mu    sync.Mutex // serialises executions
	count int

	smu    sync.Mutex
	pgid   int // the running step's process group, 0 if none
	closed bool
}

func (k *Kernel) Language() string { return k.lang }

// Execute compiles code (compiler output is reported only on failure, as a
// CompileError) and runs the program, streaming its output.
func (k *Kernel) Execute(ctx context.Context, code string, env map[string]string, emit func(api.Event) error) (int, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.smu.Lock()
	closed := k.closed
	k.smu.Unlock()
	if closed {
		return 0, errClosed
	}
	if !kernel.IsHidden(ctx) {
		k.count++
	}
	n := k.count

	dir, err := k.workDir()
	if err != nil {
		return n, err
	}
	defer os.RemoveAll(dir)
	src := k.tc.source(code)
	program, result := code, false
	if k.tc.snippet != nil {
		program, result = k.tc.snippet(code, false)
	}
	stepEnv := append(append([]string(nil), k.opts.Env...), k.toolEnv()...)
	for key, v := range env {
		stepEnv = append(stepEnv, key+"="+v)
	}

	var out limitedBuffer
	st, err := k.compile(ctx, dir, src, program, stepEnv, &out)
	if err == nil && st.code != 0 && result && strings.Contains(out.String(), "'void' type not allowed here") {
		// The last expression was a call of a void method: a statement.
		program, result = k.tc.snippet(code, true)
		out = limitedBuffer{}
		st, err = k.compile(ctx, dir, src, program, stepEnv, &out)
	}
	if err != nil {
		return n, interrupted(ctx, err, emit)
	}
	var ee *api.ExecutionError
	switch {
	case st.missing != "":
		ee = &api.ExecutionError{Name: "CompileError", Value: st.missing + ": command not found",
			Traceback: "the " + k.lang + " toolchain (" + st.missing + ") is not installed in this sandbox"}
	case st.code != 0:
		ee = &api.ExecutionError{Name: "CompileError", Value: firstError(out.String()), Traceback: out.String()}
	}
	if ee != nil {
		return n, emitError(emit, ee)
	}

	st, err = k.step(ctx, dir, stepEnv, k.tc.run(src), emit)
	if err != nil {
		return n, interrupted(ctx, err, emit)
	}
	switch {
	case st.missing != "":
		return n, emitError(emit, &api.ExecutionError{Name: "ExecError", Value: st.missing + ": command not found"})
	case st.code != 0:
		return n, emitError(emit, exitError(st.code))
	}
	if result {
		return n, emitResult(dir, emit)
	}
	return n, nil
}

// compile writes program to src in dir and compiles it, its output to out.
func (k *Kernel) compile(ctx context.Context, dir, src, program string, env []string, out *limitedBuffer) (status, error) {
	if err := os.WriteFile(filepath.Join(dir, src), []byte(program), 0o644); err != nil {
		return status{}, fmt.Errorf("writing source: %w", err)
	}
	if err := k.chown(filepath.Join(dir, src)); err != nil {
		return status{}, err
	}
	return k.step(ctx, dir, env, k.tc.compile(src), func(ev api.Event) error { out.Write(ev.Data); return nil })
}

// emitResult reports the value a snippet's last expression wrote to
// javaResultFile as the cell's main result.
func emitResult(dir string, emit func(api.Event) error) error {
	b, err := os.ReadFile(filepath.Join(dir, javaResultFile))
	if err != nil {
		return nil // the program ended before it got there
	}
	if len(b) > maxResult {
		b = b[:maxResult]
	}
	ev := api.Event{Type: api.EventResult, Result: &api.Result{IsMainResult: true, Data: map[string]string{"text/plain": string(b)}}}
	if err := emit(ev); err != nil {
		return fmt.Errorf("emitting event: %w", err)
	}
	return nil
}

// maxResult bounds a snippet's result text.
const maxResult = 1 << 20

func emitError(emit func(api.Event) error, ee *api.ExecutionError) error {
	if err := emit(api.Event{Type: api.EventExecutionError, ExecutionError: ee}); err != nil {
		return fmt.Errorf("emitting event: %w", err)
	}
	return nil
}

// interrupted reports an execution ended by ctx (or by a failed emit).
func interrupted(ctx context.Context, err error, emit func(api.Event) error) error {
	if ctx.Err() != nil {
		emit(api.Event{Type: api.EventExecutionError, ExecutionError: &api.ExecutionError{
			Name: "Interrupted", Value: "execution interrupted"}})
		return fmt.Errorf("executing cell: %w", ctx.Err())
	}
	return err
}

func exitError(code int) *api.ExecutionError {
	if code > 128 && code <= 128+64 {
		return &api.ExecutionError{Name: "ExitError",
			Value: fmt.Sprintf("exit status %d (signal: %v)", code, syscall.Signal(code-128))}
	}
	return &api.ExecutionError{Name: "ExitError", Value: fmt.Sprintf("exit status %d", code)}
}

// diagnostic matches a compiler's "file:line[:col]: message" line.
var diagnostic = regexp.MustCompile(`^\S+:\d+(:\d+)?: `)

// firstError picks the compiler's first error line.
func firstError(out string) string {
	lines := strings.Split(out, "\n")
	for _, l := range lines {
		if strings.Contains(l, "error") || diagnostic.MatchString(l) {
			return strings.TrimSpace(l)
		}
	}
	for _, l := range lines {
		if s := strings.TrimSpace(l); s != "" {
			return s
		}
	}
	return "compilation failed"
}

func (k *Kernel) toolEnv() []string {
	if k.tc.env == nil {
		return nil
	}
	return k.tc.env(k.opts)
}

// workDir makes the execution's temporary directory, owned by the user.
func (k *Kernel) workDir() (string, error) {
	base := getenv(k.opts.Env, "TMPDIR")
	if base == "" {
		base = os.TempDir()
	}
	dir, err := os.MkdirTemp(base, "kiln-"+k.lang+"-")
	if err != nil {
		return "", fmt.Errorf("creating work directory: %w", err)
	}
	if err := k.chown(dir); err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	return dir, nil
}

func (k *Kernel) chown(path string) error {
	if os.Geteuid() != 0 || (k.opts.UID == 0 && k.opts.GID == 0) {
		return nil
	}
	if err := os.Chown(path, int(k.opts.UID), int(k.opts.GID)); err != nil {
		return fmt.Errorf("changing owner of work directory: %w", err)
	}
	return nil
}

// Interrupt kills the running compiler or program with its process group
// (there is no state to keep).
func (k *Kernel) Interrupt(ctx context.Context) error {
	k.smu.Lock()
	pgid := k.pgid
	k.smu.Unlock()
	if pgid > 0 {
		syscall.Kill(-pgid, syscall.SIGKILL)
	}
	return nil
}

// Restart resets the execution count; there is no interpreter to replace.
func (k *Kernel) Restart(ctx context.Context) error {
	k.Interrupt(ctx)
	k.mu.Lock()
	defer k.mu.Unlock()
	k.count = 0
	return nil
}

func (k *Kernel) Close() error {
	k.smu.Lock()
	k.closed = true
	k.smu.Unlock()
	return k.Interrupt(context.Background())
}

func getenv(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], key+"="); ok {
			return v
		}
	}
	return ""
}

// limitedBuffer keeps the first compileOutputLimit bytes written to it.
type limitedBuffer struct{ b []byte }

func (l *limitedBuffer) Write(p []byte) {
	if room := compileOutputLimit - len(l.b); room > 0 {
		l.b = append(l.b, p[:min(room, len(p))]...)
	}
}

func (l *limitedBuffer) String() string { return string(l.b) }
