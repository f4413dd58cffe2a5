package sandbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/oci"
	"github.com/kiln-sh/kiln/internal/oci/ocitest"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/template"
)

const codeInterpreter = "code-interpreter"

// requireCodeInterpreter skips (fails in CI) without the code-interpreter
// template.
func requireCodeInterpreter(t *testing.T, cfg sandbox.Config) {
	t.Helper()
	_, err := template.Lookup(cfg.DataDir, codeInterpreter)
	ocitest.Require(t, err == nil, fmt.Sprintf("code-interpreter template not built (make setup): %v", err))
}

// logBuffer collects a Manager's log lines (and sends them to the test log).
type logBuffer struct {
	t  *testing.T
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	l.b.Write(p)
	l.mu.Unlock()
	l.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// newLoggedManager is newManager with its log kept, on the given runtimes.
func newLoggedManager(t *testing.T, cfg sandbox.Config, rts map[string]oci.Runtime) (*sandbox.Manager, *sandbox.Images, *logBuffer) {
	t.Helper()
	lb := &logBuffer{t: t}
	m, err := sandbox.NewManager(context.Background(), cfg, rts, slog.New(slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	im, err := sandbox.NewImages(context.Background(), m)
	if err != nil {
		t.Fatal(err)
	}
	return m, im, lb
}

// pandasLoaded is Python that tells whether pandas was imported before
// it (a warm kernel), without importing it.
const pandasLoaded = `'pandas' in __import__('sys').modules`

// buildWarm makes (or finds) the warm checkpoint of code-interpreter for
// this test binary's agent.
func buildWarm(t *testing.T, im *sandbox.Images) *template.Checkpoint {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	t0 := time.Now()
	c, err := im.BuildWarm(ctx, codeInterpreter)
	if err != nil {
		t.Fatalf("building warm checkpoint: %v", err)
	}
	t.Logf("warm checkpoint %s ready in %v (built in %s)", c.Key, time.Since(t0), c.Took)
	return c
}

// Sandboxes made from the warm code-interpreter template start with the
// kernel up and pandas imported, are independent of each other, and see
// their own id and the create request's env in code and commands.
func TestWarmTemplate(t *testing.T) {
	requireRunsc(t)
	cfg := testConfig(t)
	requireCodeInterpreter(t, cfg)
	m, im, logs := newLoggedManager(t, cfg, runtimes(cfg.Config))
	buildWarm(t, im)

	es := make([]*env, 2)
	for i := range es {
		t0 := time.Now()
		es[i] = create(t, m, sandbox.CreateOptions{Template: codeInterpreter, Runtime: "runsc",
			Env: map[string]string{"WHO": fmt.Sprint("sandbox-", i)}})
		t.Logf("create from the warm template: %v", time.Since(t0))
	}
	if n := strings.Count(logs.String(), "from=\"warm checkpoint\""); n != 2 {
		t.Errorf("%d of 2 creates restored the warm checkpoint", n)
	}
	for i, e := range es {
		if _, r := e.Py(pandasLoaded); r != "True" {
			t.Errorf("sandbox %d: pandas loaded = %s, want True (a warm kernel)", i, r)
		}
		if _, r := e.Py("1+1"); r != "2" {
			t.Errorf("sandbox %d: 1+1 = %q", i, r)
		}
		want := fmt.Sprint("sandbox-", i)
		if out, _ := e.Py(`import os; print(os.environ.get("WHO"), os.environ.get("KILN_SANDBOX_ID"))`); out != want+" "+e.SB.ID.String()+"\n" {
			t.Errorf("sandbox %d: kernel env WHO, KILN_SANDBOX_ID = %q, want %s %s", i, out, want, e.SB.ID)
		}
		if r := e.Sh(`echo "$WHO $KILN_SANDBOX_ID $(hostname)"`); r.Stdout != fmt.Sprintf("%s %s %s\n", want, e.SB.ID, e.SB.ID) {
			t.Errorf("sandbox %d: command sees %q", i, r.Stdout)
		}
	}
	es[0].Py("secret = 41")
	if _, r := es[1].Py("'secret' in globals()"); r != "False" {
		t.Errorf("a variable set in one warm sandbox is visible in another: %s", r)
	}
	if _, r := es[0].Py("secret + 1"); r != "42" {
		t.Errorf("secret + 1 = %q", r)
	}
	// Each restore reseeds: the "random" numbers differ.
	_, r0 := es[0].Py("import random; random.random()")
	_, r1 := es[1].Py("import random; random.random()")
	if r0 == r1 {
		t.Errorf("two warm sandboxes drew the same random number %s", r0)
	}
	// A file written in one is not in the other.
	es[0].Sh("echo mine > /home/user/f.txt")
	if r := es[1].Sh("cat /home/user/f.txt"); r.Exit.Code == 0 {
		t.Errorf("file written in one warm sandbox is in another: %q", r.Stdout)
	}
}

// Without a usable warm checkpoint (here: other runsc flags, so another
// key), or when restoring it fails, creates boot cold, say why in the
// log, and work; runc sandboxes always boot.
func TestWarmFallsBackToCold(t *testing.T) {
	requireRunsc(t)
	cfg := testConfig(t)
	requireCodeInterpreter(t, cfg)
	{
		_, im := newImages(t, cfg)
		buildWarm(t, im)
	}
	check := func(t *testing.T, m *sandbox.Manager, logs *logBuffer, rt, reason string) {
		t.Helper()
		e := create(t, m, sandbox.CreateOptions{Template: codeInterpreter, Runtime: rt, Env: map[string]string{"WHO": "cold"}})
		if !strings.Contains(logs.String(), "booting cold") || !strings.Contains(logs.String(), reason) {
			t.Errorf("no log line saying why the create booted cold (%q)", reason)
		}
		if _, r := e.Py(pandasLoaded); r != "False" {
			t.Errorf("pandas loaded = %s in a cold kernel", r)
		}
		if out, r := e.Py(`import os; print(os.environ["WHO"]); 1+1`); r != "2" || out != "cold\n" {
			t.Errorf("cold kernel: %q %q", out, r)
		}
	}
	t.Run("key changed", func(t *testing.T) {
		c := cfg
		c.RunscExtraFlags = []string{"--watchdog-action=log"} // a flag Kiln does not pass: only the key changes
		m, _, logs := newLoggedManager(t, c, runtimes(c.Config))
		check(t, m, logs, "runsc", "no warm checkpoint")
	})
	t.Run("restore fails", func(t *testing.T) {
		rts := runtimes(cfg.Config)
		rts["runsc"] = &brokenRestore{rts["runsc"].(*oci.CLI)}
		m, _, logs := newLoggedManager(t, cfg, rts)
		check(t, m, logs, "runsc", "restoring the warm checkpoint failed")
		if ents, err := stateDirs(cfg); err != nil || len(ents) != 1 {
			t.Errorf("state dir after a failed warm restore: %v %v, want only the sandbox", ents, err)
		}
	})
	t.Run("runc", func(t *testing.T) {
		m, _, logs := newLoggedManager(t, cfg, runtimes(cfg.Config))
		check(t, m, logs, "runc", "runc cannot restore checkpoints")
	})
}

// brokenRestore is runsc whose restores fail.
type brokenRestore struct{ *oci.CLI }

func (b *brokenRestore) Restore(ctx context.Context, id string, _ *oci.Bundle, _ string, _ oci.IO) error {
	return errors.New("injected restore failure")
}

func stateDirs(cfg sandbox.Config) ([]string, error) {
	ents, err := os.ReadDir(cfg.StateDir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names, err
}

// A template of one's own with a warm step that starts a background
// process and waits for it: sandboxes made from it have the process
// running. A warm build sandbox that a crashed builder left behind is
// destroyed by the next WarmTemplates.
func TestWarmStartAndReady(t *testing.T) {
	requireRunsc(t)
	cfg := testConfig(t)
	base, err := template.Lookup(cfg.DataDir, "base")
	if err != nil {
		t.Fatal(err)
	}
	// A private data dir whose template "warmbase" is the base rootfs with
	// a warm step.
	cfg.DataDir = t.TempDir()
	build := filepath.Join(template.Dir(cfg.DataDir), "warmbase", "h1")
	if err := os.MkdirAll(build, 0o755); err != nil {
		t.Fatal(err)
	}
	man, _ := json.Marshal(template.Template{Name: "warmbase", Hash: "h1", Layers: base.Layers, Defaults: base.Defaults, Warm: &template.Warm{
		Start: "echo started > /tmp/started; exec sleep 1000", Ready: "test -f /tmp/started",
	}})
	if err := os.WriteFile(filepath.Join(build, "template.json"), man, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("h1", filepath.Join(template.Dir(cfg.DataDir), "warmbase", "current")); err != nil {
		t.Fatal(err)
	}
	m, im, logs := newLoggedManager(t, cfg, runtimes(cfg.Config))
	ctx := context.Background()

	left, err := im.LeaveWarmBuildSandbox(ctx, "warmbase")
	if err != nil {
		t.Fatal(err)
	}
	im.WarmTemplates(ctx)
	tmpl, _ := template.Lookup(cfg.DataDir, "warmbase")
	if ents, _ := os.ReadDir(tmpl.WarmSandboxDir()); len(ents) != 0 {
		t.Errorf("warm build sandboxes left: %v", ents)
	}
	if _, err := runtimes(cfg.Config)["runsc"].State(ctx, left.String()); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("the crashed build's container is still there: %v", err)
	}

	e := create(t, m, sandbox.CreateOptions{Template: "warmbase"})
	if !strings.Contains(logs.String(), `from="warm checkpoint"`) {
		t.Fatal("the create did not restore the warm checkpoint")
	}
	if r := e.Sh("cat /tmp/started; pgrep -f 'sleep 1000' >/dev/null && echo running"); r.Stdout != "started\nrunning\n" {
		t.Errorf("warm step's effects in the sandbox: %q %q", r.Stdout, r.Stderr)
	}
}
