package sandbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/oci"
	"github.com/kiln-sh/kiln/internal/oci/ocitest"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/sandbox/sandboxtest"
)

// agentPath is a kiln-agent built once for the package's tests.
var agentPath string

func TestMain(m *testing.M) { os.Exit(sandboxtest.Main(m, &agentPath)) }

// testConfig is the server config for tests: the real data dir (for the
// base template) and a private state dir.
func testConfig(t *testing.T) sandbox.Config {
	t.Helper()
	return sandboxtest.Config(t, agentPath)
}

func runtimes(cfg config.Config) map[string]oci.Runtime { return sandboxtest.OCIRuntimes(cfg) }

func newManager(t *testing.T, cfg sandbox.Config) *sandbox.Manager {
	t.Helper()
	m, _ := newImages(t, cfg)
	return m
}

// newImages starts a Manager and its Images, wired as kiln serve wires
// them.
func newImages(t *testing.T, cfg sandbox.Config) (*sandbox.Manager, *sandbox.Images) {
	t.Helper()
	log := slog.New(slog.NewTextHandler(testWriter{t}, nil))
	m, err := sandbox.NewManager(context.Background(), cfg, runtimes(cfg.Config), log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	im, err := sandbox.NewImages(context.Background(), m)
	if err != nil {
		t.Fatal(err)
	}
	return m, im
}

// forEachRuntime runs f as a subtest per runtime: the conformance suite.
func forEachRuntime(t *testing.T, f func(t *testing.T, rt string)) {
	for _, rt := range []string{"runsc", "runc"} {
		t.Run(rt, func(t *testing.T) {
			_, err := exec.LookPath(rt)
			ocitest.Require(t, err == nil, rt+" not installed")
			f(t, rt)
		})
	}
}

// env is one test sandbox; create makes one that is killed when the test
// ends.
type env = sandboxtest.Box

func create(t *testing.T, m *sandbox.Manager, opts sandbox.CreateOptions) *env {
	t.Helper()
	return sandboxtest.Create(t, m, opts)
}

func TestLifecycle(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		cfg := testConfig(t)
		m := newManager(t, cfg)
		ctx := context.Background()
		sb, err := m.Create(ctx, sandbox.CreateOptions{Runtime: rt, Metadata: map[string]string{"k": "v"}})
		if err != nil {
			t.Fatal(err)
		}
		if sb.State != sandbox.StateRunning || sb.Runtime != rt || sb.Template != "base" {
			t.Errorf("created %+v", sb)
		}
		if got, err := m.Get(context.Background(), sb.ID); err != nil || got.ID != sb.ID {
			t.Errorf("Get = %+v, %v", got, err)
		}
		if l := m.Live(); len(l) != 1 || l[0].ID != sb.ID {
			t.Errorf("List = %+v", l)
		}
		a, _ := m.Agent(sb.ID)
		if err := a.Ping(ctx); err != nil {
			t.Fatal(err)
		}
		e := sandboxtest.Wrap(t, m, sb, a)
		if r := e.Sh("hostname"); strings.TrimSpace(r.Stdout) != sb.ID.String() {
			t.Errorf("hostname = %q, want %s", r.Stdout, sb.ID)
		}
		pid := runtimePid(t, rt, sb.ID)

		if err := m.Kill(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		if got, err := m.Get(context.Background(), sb.ID); err != nil || got.State != sandbox.StateStopped || got.Reason != "killed" {
			t.Errorf("Get after kill: %+v, %v; want the stopped record", got, err)
		}
		if l := m.Live(); len(l) != 0 {
			t.Errorf("Live after kill: %+v", l)
		}
		if err := m.Kill(ctx, sb.ID); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("second kill: %v, want not found", err)
		}
		assertNothingLeft(t, cfg, sb.ID, pid)
	})
}

// runtimePid is the sandbox's init (runc) or sandbox process (runsc).
func runtimePid(t *testing.T, rt string, id sandbox.ID) int {
	t.Helper()
	cfg := config.FromEnv()
	st, err := runtimes(cfg)[rt].State(context.Background(), id.String())
	if err != nil {
		t.Fatalf("runtime state: %v", err)
	}
	return st.Pid
}

// assertNothingLeft checks that a destroyed sandbox left no processes,
// mounts, cgroups, runtime state or files.
func assertNothingLeft(t *testing.T, cfg sandbox.Config, id sandbox.ID, pid int) {
	t.Helper()
	if pid > 0 {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			t.Errorf("sandbox process %d still exists", pid)
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, _ := os.ReadFile(p)
		if bytes.Contains(b, []byte(id)) {
			t.Errorf("process %s still mentions the sandbox: %q", p, bytes.ReplaceAll(b, []byte{0}, []byte{' '}))
		}
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if bytes.Contains(mounts, []byte(id)) {
		t.Errorf("mounts left behind:\n%s", grepLines(mounts, string(id)))
	}
	for _, c := range []string{"memory", "pids", "cpu", "cpuacct", "freezer"} {
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", c, "kiln", id.String())); err == nil {
			t.Errorf("cgroup %s/kiln/%s left behind", c, id)
		}
	}
	if _, err := os.Stat(filepath.Join(cfg.StateDir, id.String())); err == nil {
		t.Errorf("sandbox dir left behind")
	}
	for _, rt := range []string{"runsc", "runc"} {
		if _, err := os.Stat(filepath.Join(cfg.RunDir, rt, id.String())); err == nil {
			t.Errorf("%s state left behind", rt)
		}
	}
	if out := settledLoops(id.String(), 0); bytes.Contains(out, []byte(id)) {
		t.Errorf("loop devices left behind:\n%s", grepLines(out, string(id)))
	}
}

// settledLoops returns `losetup -a` once it names s want times, or after
// 15 s. A layer's loop device clears itself (autoclear) when its last
// mount goes, and a process that copied the host's mounts while the layer
// was mounted (any sandbox or namespace starting meanwhile, also in
// other test packages) holds one until it lets go.
func settledLoops(s string, want int) []byte {
	deadline := time.Now().Add(15 * time.Second)
	for {
		out, _ := exec.Command("losetup", "-a").Output()
		if bytes.Count(out, []byte(s)) == want || time.Now().After(deadline) {
			return out
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func grepLines(b []byte, s string) string {
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestCreateRejectsBadInput(t *testing.T) {
	cfg := testConfig(t)
	m := newManager(t, cfg)
	ctx := context.Background()
	tests := []struct {
		name string
		opts sandbox.CreateOptions
		want error
	}{
		{"unknown template", sandbox.CreateOptions{Template: "nope"}, errdefs.ErrNotFound},
		{"bad template name", sandbox.CreateOptions{Template: "../etc"}, errdefs.ErrInvalidArgument},
		{"unknown runtime", sandbox.CreateOptions{Runtime: "docker"}, errdefs.ErrInvalidArgument},
		{"negative cpus", sandbox.CreateOptions{Limits: sandbox.Limits{CPUs: -1}}, errdefs.ErrInvalidArgument},
		{"absurd cpus", sandbox.CreateOptions{Limits: sandbox.Limits{CPUs: 1000}}, errdefs.ErrInvalidArgument},
		{"tiny memory", sandbox.CreateOptions{Limits: sandbox.Limits{MemoryBytes: 1 << 20}}, errdefs.ErrInvalidArgument},
		{"absurd memory", sandbox.CreateOptions{Limits: sandbox.Limits{MemoryBytes: 1 << 50}}, errdefs.ErrInvalidArgument},
		{"absurd disk", sandbox.CreateOptions{Limits: sandbox.Limits{DiskBytes: 1 << 50}}, errdefs.ErrInvalidArgument},
		{"tiny pids", sandbox.CreateOptions{Limits: sandbox.Limits{Pids: 1}}, errdefs.ErrInvalidArgument},
		{"reserved env", sandbox.CreateOptions{Env: map[string]string{"KILN_X": "1"}}, errdefs.ErrInvalidArgument},
		{"bad env key", sandbox.CreateOptions{Env: map[string]string{"A=B": "1"}}, errdefs.ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := m.Create(ctx, tt.opts)
			if !errors.Is(err, tt.want) {
				t.Fatalf("Create: %v, want %v", err, tt.want)
			}
		})
	}
	if l := m.Live(); len(l) != 0 {
		t.Errorf("half-made sandboxes listed: %+v", l)
	}
	if ents, _ := os.ReadDir(cfg.StateDir); len(ents) != 0 {
		t.Errorf("state dir not empty: %v", ents)
	}
}

// A failure after the container exists (here: an agent that never
// answers) unwinds everything.
func TestFailedCreateUnwinds(t *testing.T) {
	cfg := testConfig(t)
	bogus := filepath.Join(t.TempDir(), "kiln-agent")
	if err := os.WriteFile(bogus, []byte("#!/bin/sh\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg.AgentPath = bogus
	cfg.DataDir = dataDirWithBase(t)
	m := newManager(t, cfg)
	forEachRuntime(t, func(t *testing.T, rt string) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := m.Create(ctx, sandbox.CreateOptions{Runtime: rt}); err == nil {
			t.Fatal("Create with a broken agent succeeded")
		}
		if ents, _ := os.ReadDir(cfg.StateDir); len(ents) != 0 {
			t.Errorf("state dir not empty: %v", ents)
		}
		mounts, _ := os.ReadFile("/proc/self/mountinfo")
		if bytes.Contains(mounts, []byte(cfg.StateDir)) {
			t.Errorf("mounts left behind:\n%s", grepLines(mounts, cfg.StateDir))
		}
	})
}

// dataDirWithBase is a private data dir that shares the real base template,
// so a test can install its own agent binary.
func dataDirWithBase(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	real := filepath.Join(config.FromEnv().DataDir, "templates")
	if err := os.Symlink(real, filepath.Join(dir, "templates")); err != nil {
		t.Fatal(err)
	}
	return dir
}

// testWriter sends a Manager's logs to the test's log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// A sandbox that dies under us (here: its runtime process is killed on the
// host, as the kernel's OOM killer would) is noticed, marked failed with a
// reason, and cleaned up completely.
func TestSandboxDeathIsCleanedUp(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		cfg := testConfig(t)
		m := newManager(t, cfg)
		e := create(t, m, sandbox.CreateOptions{Runtime: rt})
		pid := runtimePid(t, rt, e.SB.ID)
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(20 * time.Second)
		for {
			if sb, err := m.Get(context.Background(), e.SB.ID); err == nil && sb.State == sandbox.StateFailed {
				if !strings.Contains(sb.Reason, "exited unexpectedly") {
					t.Errorf("failed with reason %q", sb.Reason)
				}
				// Short, one line, no host paths: details are in the log.
				if len(sb.Reason) > 210 || strings.Contains(sb.Reason, "\n") || strings.Contains(sb.Reason, cfg.StateDir) {
					t.Errorf("reason is not a short line: %q", sb.Reason)
				}
				break
			}
			if time.Now().After(deadline) {
				sb, _ := m.Get(context.Background(), e.SB.ID)
				t.Fatalf("dead sandbox still listed: %+v", sb)
			}
			time.Sleep(50 * time.Millisecond)
		}
		assertNothingLeft(t, cfg, e.SB.ID, pid)
	})
}
