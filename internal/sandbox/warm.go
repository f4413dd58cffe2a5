package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/oci"
	"github.com/kiln-sh/kiln/internal/rootfs"
	"github.com/kiln-sh/kiln/internal/template"
)

// Warm templates (Images). A template whose recipe has a warm step
// (template.Warm) gets a warm checkpoint: a sandbox booted from it ran the
// step (e.g. started the Python kernel and imported pandas) and was
// checkpointed, memory image and writable layer, into the template's
// build dir. A create from the template restores a copy of that checkpoint
// instead of booting (like a fork of it): the Manager asks for it through
// its image seam (warmCheckpoint) and brings the sandbox up on the
// pipeline's warm path (paths.go). The checkpoint is only usable by the same runsc
// build and flags and the same agent build (restore re-opens the agent's
// bind mount by path, and the sentry's state must match), so it is kept
// under a key of the step and those; without a usable one, or when a
// restore fails, sandboxes boot cold (with a log line).

// warmBuilds serialises warm builds per template.
type warmBuilds struct {
	mu    sync.Mutex
	locks map[string]*sync.Mutex

	keyOnce sync.Once
	env     []string // what checkpoints depend on besides the step; see warmEnv
}

// warmEnv is what a warm checkpoint depends on besides its step: the runsc
// build (its version output and size) and flags, the agent build, and the
// sandbox's capabilities (a restored sandbox keeps the checkpoint's).
func (im *Images) warmEnv() []string {
	w := &im.warm
	w.keyOnce.Do(func() {
		out, _ := exec.Command(im.cfg.RunscPath, "--version").Output()
		size := int64(-1)
		if p, err := exec.LookPath(im.cfg.RunscPath); err == nil {
			if fi, err := os.Stat(p); err == nil {
				size = fi.Size()
			}
		}
		w.env = []string{
			"runsc " + strings.TrimSpace(string(out)) + " size " + strconv.FormatInt(size, 10),
			"flags " + im.cfg.RunscPlatform + " " + strings.Join(im.cfg.RunscExtraFlags, " "),
			"agent " + im.agentBuild,
			"caps " + strings.Join(oci.Capabilities("runsc"), ","),
		}
	})
	return w.env
}

// warmKey is the key of tmpl's warm checkpoint on this host.
func (im *Images) warmKey(tmpl *template.Template) string { return tmpl.Warm.Key(im.warmEnv()...) }

// warmCheckpoint returns the usable warm checkpoint of tmpl for a sandbox
// of runtime rt with limits l, or nil and why there is none ("" when tmpl
// has no warm step). It is part of the image seam: the Manager's Create
// asks it.
func (im *Images) warmCheckpoint(tmpl *template.Template, rt oci.Runtime, l Limits) (*template.Checkpoint, string) {
	if tmpl.Warm == nil {
		return nil, ""
	}
	if rt == nil {
		return nil, "runsc is not configured"
	}
	if ck, ok := rt.(oci.Checkpointer); !ok || !ck.CanCheckpoint() {
		return nil, rt.Name() + " cannot restore checkpoints"
	}
	c, err := tmpl.Checkpoint(im.warmKey(tmpl))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, "no warm checkpoint for this runsc and agent build (kiln template build " + tmpl.Name + ")"
	}
	if err != nil {
		return nil, err.Error()
	}
	// The layer image has the checkpoint's size, and the agent's memory
	// and pids guards keep the checkpointed limits.
	if cl := c.Limits; l.DiskBytes != cl.DiskBytes || l.MemoryBytes != cl.MemoryBytes || l.Pids != cl.Pids {
		return nil, "the sandbox's disk, memory or pids limit differs from the warm checkpoint's"
	}
	return c, ""
}

// runCode executes code and returns its exception, if any, as an error.
func runCode(ctx context.Context, a *Agent, p wire.ExecuteParams) error {
	var failed *api.ExecutionError
	_, err := a.Execute(ctx, p, func(ev api.Event) error {
		if ev.ExecutionError != nil {
			failed = ev.ExecutionError
		}
		return nil
	})
	if err == nil && failed != nil {
		err = fmt.Errorf("%s: %s", failed.Name, failed.Value)
	}
	return err
}

// BuildWarm makes the warm checkpoint of the named template for this
// host's runsc and agent unless it exists: it boots a sandbox from the
// template with its default limits, runs the warm step, checkpoints it
// (memory image and a copy of its layer) into the template's build dir and
// destroys it. Concurrent builds of one template wait for each other.
func (im *Images) BuildWarm(ctx context.Context, name string) (*template.Checkpoint, error) {
	tmpl, err := template.Lookup(im.cfg.DataDir, name)
	if err != nil {
		return nil, err
	}
	return im.BuildWarmTemplate(ctx, tmpl)
}

// CanWarm reports whether this host can take warm checkpoints (runsc with
// checkpoint/restore).
func (im *Images) CanWarm() bool {
	ck, ok := im.runtimes["runsc"].(oci.Checkpointer)
	return ok && ck.CanCheckpoint()
}

// BuildWarmTemplate is BuildWarm for a template given directly: a
// built-in's build, or a custom template's (the template builder takes its
// warm snapshot before it marks the build ready).
func (im *Images) BuildWarmTemplate(ctx context.Context, tmpl *template.Template) (*template.Checkpoint, error) {
	name := tmpl.Name
	if tmpl.Warm == nil {
		return nil, fmt.Errorf("template %s has no warm step: %w", name, errdefs.ErrInvalidArgument)
	}
	rt := im.runtimes["runsc"]
	if !im.CanWarm() {
		return nil, fmt.Errorf("warm templates need runsc (checkpoint/restore): %w", errdefs.ErrFailedPrecondition)
	}
	lock := im.warm.lock(tmpl.Dir)
	lock.Lock()
	defer lock.Unlock()
	key := im.warmKey(tmpl)
	if c, err := tmpl.Checkpoint(key); err == nil {
		return c, nil
	}
	unlock, err := tmpl.LockWarm(ctx) // another process may be building it
	if err != nil {
		return nil, err
	}
	defer unlock()
	if c, err := tmpl.Checkpoint(key); err == nil {
		return c, nil
	}
	im.cleanWarmLeftovers(ctx, tmpl)
	t0 := time.Now()
	limits, err := limitsFor(Limits{}, Limits{CPUs: tmpl.Defaults.CPUs, MemoryBytes: tmpl.Defaults.MemoryBytes, DiskBytes: tmpl.Defaults.DiskBytes}, im.cfg.Limits)
	if err != nil {
		return nil, err
	}
	// The build's sandbox lives in the template dir, not among the served
	// sandboxes: it is no sandbox of this server's, and a crash leaves it
	// to the next warm build (cleanWarmLeftovers), not to adoption.
	if err := os.MkdirAll(tmpl.WarmSandboxDir(), 0o700); err != nil {
		return nil, fmt.Errorf("creating warm build dir: %w", err)
	}
	b, err := im.core.unlisted(ctx, tmpl, rt, limits, nil, tmpl.WarmSandboxDir(), nil)
	if err != nil {
		return nil, fmt.Errorf("booting the warm build sandbox: %w", err)
	}
	defer im.core.discard(context.WithoutCancel(ctx), b)
	wctx, cancel := context.WithTimeout(ctx, tmpl.Warm.Timeout())
	defer cancel()
	if err := runWarmStep(wctx, &Agent{conn: b.conn}, tmpl.Warm); err != nil {
		return nil, fmt.Errorf("running the warm step of %s: %w%s", name, err, agentLogTail(b.dir))
	}
	work, err := tmpl.NewCheckpointDir()
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work) // gone once published
	c := &template.Checkpoint{Key: key, Limits: template.Limits(limits), Dir: work}
	if _, _, err := im.capture(ctx, b, work, "warmed", nil); err != nil { // c.Image() and c.Disk() in work
		return nil, err
	}
	c.Runtime, c.Agent = im.warmEnv()[0], im.agentBuild
	c.CreatedAt, c.Took = time.Now().UTC(), time.Since(t0).Round(time.Millisecond).String()
	if c, err = tmpl.PublishCheckpoint(work, c); err != nil {
		return nil, err
	}
	im.log.Info("warm checkpoint built", "template", name, "key", key, "took", time.Since(t0))
	return c, nil
}

func (w *warmBuilds) lock(key string) *sync.Mutex {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.locks == nil {
		w.locks = map[string]*sync.Mutex{}
	}
	if w.locks[key] == nil {
		w.locks[key] = &sync.Mutex{}
	}
	return w.locks[key]
}

// runWarmStep runs a template's warm step in a fresh sandbox: Start in the
// background, Code in its language's default context, then Ready until it
// succeeds. Each run of Ready may take until the warm step's deadline, as
// on E2B: its waitForTimeout(ms) is a plain "sleep" (the ready command of
// every Dockerfile CMD that `e2b template create` compiles is "sleep 20").
func runWarmStep(ctx context.Context, a *Agent, w *template.Warm) error {
	if w.Start != "" {
		started := make(chan error, 1)
		go func() {
			_, err := a.Exec(context.WithoutCancel(ctx), wire.ExecParams{Cmd: w.Start, Cwd: w.Cwd, Tag: "warm-start"}, func(ev api.Event) error {
				if ev.Type == api.EventStart {
					started <- nil
				}
				return nil
			})
			started <- err
		}()
		if err := <-started; err != nil {
			return fmt.Errorf("starting %q: %w", w.Start, err)
		}
	}
	if w.Code != "" {
		p := wire.ExecuteParams{Language: w.Language, Code: w.Code, TimeoutMs: time.Until(deadline(ctx)).Milliseconds(), Hidden: true}
		if err := runCode(ctx, a, p); err != nil {
			return fmt.Errorf("running the warm code: %w", err)
		}
	}
	for w.Ready != "" {
		exit, err := a.Exec(ctx, wire.ExecParams{Cmd: w.Ready, Cwd: w.Cwd, TimeoutMs: max(time.Until(deadline(ctx)).Milliseconds(), 1)}, func(api.Event) error { return nil })
		if err == nil && exit != nil && exit.Code == 0 && exit.Reason == api.ExitNormal {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %q to succeed: %w", w.Ready, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
	return nil
}

func deadline(ctx context.Context) time.Time {
	if d, ok := ctx.Deadline(); ok {
		return d
	}
	return time.Now().Add(template.DefaultWarmTimeout)
}

// cleanWarmLeftovers destroys the warm build sandboxes that crashed
// builders left in tmpl's build dir. Callers hold tmpl.LockWarm.
func (im *Images) cleanWarmLeftovers(ctx context.Context, tmpl *template.Template) {
	parent := tmpl.WarmSandboxDir()
	ents, _ := os.ReadDir(parent)
	for _, e := range ents {
		id, err := ParseID(e.Name())
		if err != nil {
			continue
		}
		im.log.Warn("destroying a warm build sandbox left by a crash", "sandbox_id", id, "template", tmpl.Name)
		dir := filepath.Join(parent, e.Name())
		for _, rt := range im.runtimes {
			_ = deleteContainer(ctx, rt, id, dir, nil)
		}
		if err := rootfs.Unmount(ctx, filepath.Join(dir, layerDir)); err != nil {
			im.log.Error("unmounting leftover warm build sandbox", "sandbox_id", id, "err", err)
			continue
		}
		_ = os.RemoveAll(dir)
	}
}

// WarmTemplates builds, one after another, the missing warm checkpoints of
// every built template that has a warm step (kiln serve runs it in the
// background at start; until a checkpoint exists its template's sandboxes
// boot cold). Failures are logged.
func (im *Images) WarmTemplates(ctx context.Context) {
	ts, err := template.List(im.cfg.DataDir)
	if err != nil {
		im.log.Error("listing templates to warm", "err", err)
		return
	}
	for _, t := range ts {
		if t.Warm == nil || ctx.Err() != nil {
			continue
		}
		// Leftovers of a build that a crash interrupted, unless a build
		// is running now (then it is that builder's business).
		done, cancel := context.WithCancel(ctx)
		cancel()
		if unlock, err := t.LockWarm(done); err == nil {
			im.cleanWarmLeftovers(ctx, t)
			unlock()
		}
		if c, why := im.warmCheckpoint(t, im.runtimes["runsc"], Limits{}); c == nil && strings.HasPrefix(why, "no warm checkpoint") {
			im.log.Info("building warm checkpoint", "template", t.Name)
			if _, err := im.BuildWarm(ctx, t.Name); err != nil && ctx.Err() == nil {
				im.log.Error("building warm checkpoint; its sandboxes boot cold", "template", t.Name, "err", err)
			}
		}
	}
}
