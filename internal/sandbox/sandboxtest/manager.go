package sandboxtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/oci"
	"github.com/kiln-sh/kiln/internal/oci/ocitest"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/store/sqlite"
	"github.com/kiln-sh/kiln/internal/template"
)

// Runtimes are the names every sandbox suite runs against.
var Runtimes = []string{"runsc", "runc"}

// OCIRuntimes returns the configured runtime drivers, as kiln serve makes
// them.
func OCIRuntimes(cfg config.Config) map[string]oci.Runtime {
	return map[string]oci.Runtime{
		"runsc": oci.Runsc(oci.Config{Binary: cfg.RunscPath, Root: filepath.Join(cfg.RunDir, "runsc"),
			Flags: append(oci.RunscFlags(context.Background(), cfg.RunscPath, cfg.RunscPlatform), cfg.RunscExtraFlags...)}),
		"runc": oci.Runc(oci.Config{Binary: cfg.RuncPath, Root: filepath.Join(cfg.RunDir, "runc")}),
	}
}

// Config is a Manager config for tests: the real data dir (for the base
// template), the given agent, a private state dir and SQLite store. It
// skips (fails with CI=true) without root or the base template.
func Config(t testing.TB, agentPath string) sandbox.Config {
	t.Helper()
	ocitest.RequireRoot(t)
	cfg := config.FromEnv()
	cfg.AgentPath = agentPath
	_, err := template.Lookup(cfg.DataDir, "base")
	ocitest.Require(t, err == nil, fmt.Sprintf("base template not built (make setup): %v", err))
	dir := t.TempDir()
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "kiln.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return sandbox.Config{Config: cfg, StateDir: filepath.Join(dir, "sandboxes"), Store: st}
}

// NewManager starts a Manager, with its Images wired as kiln serve wires
// them, whose logs go to the test log; it is closed (its sandboxes killed)
// when the test ends.
func NewManager(t testing.TB, cfg sandbox.Config) *sandbox.Manager {
	t.Helper()
	m, _ := NewManagerImages(t, cfg)
	return m
}

// NewManagerImages is NewManager that also returns the Manager's Images
// (snapshots, forks, warm checkpoints, pools).
func NewManagerImages(t testing.TB, cfg sandbox.Config) (*sandbox.Manager, *sandbox.Images) {
	t.Helper()
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	m, err := sandbox.NewManager(context.Background(), cfg, OCIRuntimes(cfg.Config), log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, sb := range m.Live() {
			_ = m.Kill(ctx, sb.ID)
		}
		m.Close()
	})
	im, err := sandbox.NewImages(context.Background(), m)
	if err != nil {
		t.Fatal(err)
	}
	return m, im
}

// ForEachRuntime runs f as a parallel subtest per runtime.
func ForEachRuntime(t *testing.T, f func(t *testing.T, rt string)) {
	for _, rt := range Runtimes {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			_, err := exec.LookPath(rt)
			ocitest.Require(t, err == nil, rt+" not installed")
			f(t, rt)
		})
	}
}

// Box is one test sandbox with its agent.
type Box struct {
	t     testing.TB
	M     *sandbox.Manager
	SB    sandbox.Sandbox
	Agent *sandbox.Agent
}

// Create makes a sandbox that is killed when the test ends.
func Create(t testing.TB, m *sandbox.Manager, opts sandbox.CreateOptions) *Box {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := m.Create(ctx, opts)
	if err != nil {
		t.Fatalf("creating sandbox: %v", err)
	}
	t.Cleanup(func() {
		if err := m.Kill(context.Background(), sb.ID); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("killing sandbox: %v", err)
		}
	})
	a, err := m.Agent(sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	return &Box{t: t, M: m, SB: sb, Agent: a}
}

// Wrap is the Box of sandbox sb and its agent a (nil: none yet), for a
// sandbox the test made otherwise (a fork, a restore, a re-adopted one).
func Wrap(t testing.TB, m *sandbox.Manager, sb sandbox.Sandbox, a *sandbox.Agent) *Box {
	return &Box{t: t, M: m, SB: sb, Agent: a}
}

// Result is a finished command.
type Result struct {
	Stdout, Stderr string
	Exit           *api.ExitStatus
	Events         []api.Event // the type and seq of each event
}

// Exec runs p to its end and fails the test if the agent cannot run it.
func (b *Box) Exec(p wire.ExecParams) Result {
	b.t.Helper()
	r, err := b.TryExec(p)
	if err != nil {
		b.t.Fatalf("exec %v %q: %v", p.Args, p.Cmd, err)
	}
	return r
}

// TryExec is Exec that returns the error. The call waits 2 minutes, or a
// minute past the command's own timeout when that is longer (a bound
// below the command's would end the call before the agent ends it).
func (b *Box) TryExec(p wire.ExecParams) (Result, error) {
	wait := max(2*time.Minute, time.Duration(p.TimeoutMs)*time.Millisecond+time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	var out, errb bytes.Buffer
	var events []api.Event
	exit, err := b.Agent.Exec(ctx, p, func(ev api.Event) error {
		events = append(events, api.Event{Seq: ev.Seq, Type: ev.Type})
		switch ev.Type {
		case api.EventStdout:
			out.Write(ev.Data)
		case api.EventStderr:
			errb.Write(ev.Data)
		}
		return nil
	})
	return Result{Stdout: out.String(), Stderr: errb.String(), Exit: exit, Events: events}, err
}

// Sh runs a shell command as the sandbox's user.
func (b *Box) Sh(cmd string) Result {
	b.t.Helper()
	return b.Exec(wire.ExecParams{Cmd: cmd, TimeoutMs: 60_000})
}

// RootSh runs a shell command as root in the sandbox.
func (b *Box) RootSh(cmd string) Result {
	b.t.Helper()
	return b.Exec(wire.ExecParams{Cmd: cmd, TimeoutMs: 60_000, User: wire.UserRoot})
}

// Py runs Python in the sandbox's default context and returns its stdout
// and main result (text/plain).
func (b *Box) Py(code string) (stdout, result string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var failed *api.ExecutionError
	_, err := b.Agent.Execute(ctx, wire.ExecuteParams{Language: "python", Code: code}, func(ev api.Event) error {
		switch {
		case ev.Type == api.EventStdout:
			stdout += string(ev.Data)
		case ev.Result != nil && ev.Result.IsMainResult:
			result = ev.Result.Data["text/plain"]
		case ev.ExecutionError != nil:
			failed = ev.ExecutionError
		}
		return nil
	})
	if err == nil && failed != nil {
		err = fmt.Errorf("%s: %s", failed.Name, failed.Value)
	}
	if err != nil {
		b.t.Fatalf("executing %q: %v", code, err)
	}
	return stdout, result
}

// testWriter sends logs to the test's log.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}
