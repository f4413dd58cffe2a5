package builder

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/template"
	"github.com/kiln-sh/kiln/internal/template/layer"
)

// run is one build in progress: the layer stack so far and the config
// its sandboxes will start with.
type run struct {
	b      *Builder
	rec    template.BuildRecord
	tags   []string         // point at the build once it is ready
	spec   api.TemplateSpec // with the registry credentials
	public bool
	log    *buildLog
	start  time.Time

	leased []*layer.Layer // released when the build ends
	keys   []string       // the stack's layer keys, bottom first
	dirs   []string       // their dirs, bottom first
	cfg    template.Config
	// user and workdir RUN steps run with (the template's defaults are
	// cfg's); mkWorkdir says the workdir is not known to exist yet.
	user       string
	workdir    string
	workdirSet bool // a WORKDIR step set it
	mkWorkdir  bool
	force      bool   // rebuild from here on
	step       int    // the step being run (-1: none, see stage)
	stage      string // "base" or "finalize" while step is -1
	tail       *tail
	hit        bool // the current step's layer came from the cache
}

// stepError is a build failure with the output that explains it: msg
// says what happened, class is its errdefs class (not in the message).
type stepError struct {
	msg   string
	class error
	tail  string
}

func (e *stepError) Error() string { return e.msg }
func (e *stepError) Unwrap() error { return e.class }

// hide is what a failure of the build's own machinery (a sandbox that
// would not start, a layer store error) tells the build's owner: what
// failed, not the host's paths. The server's log gets the whole error.
// Errors of the user's making (over a limit, timeouts) pass through.
func (r *run) hide(what string, err error) error {
	if errors.Is(err, errdefs.ErrResourceExhausted) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return fmt.Errorf("%s: %w", what, err)
	}
	r.b.log.Error("template build: "+what, "build", r.rec.ID, "step", r.step, "err", err)
	return &stepError{msg: what + ": internal error (the server's log has the details)", class: err}
}

// run runs the build to its end and records how it ended.
func (r *run) run(ctx context.Context) {
	r.start, r.step, r.stage, r.force = time.Now(), -1, "base", r.spec.NoCache
	r.tail = newTail()
	defer r.log.end()
	defer r.release()
	err := r.build(ctx)
	if err == nil {
		r.logEvent(api.LogReady, levelInfo, "build %s ready in %s", r.rec.ID, r.elapsed())
	} else {
		r.fail(ctx, err)
	}
	if o := r.b.cfg.Observer; o != nil {
		status := template.BuildReady
		if err != nil {
			status = template.BuildError
		}
		o.BuildDone(status, time.Since(r.start), err)
	}
}

func (r *run) elapsed() string { return time.Since(r.start).Round(100 * time.Millisecond).String() }

func (r *run) build(ctx context.Context) error {
	if err := r.base(ctx); err != nil {
		return err
	}
	if err := checkStack(r.dirs); err != nil {
		return err
	}
	// (A Debian base brings its packages: its RUN steps need no network.)
	if r.b.cfg.Network == sandbox.NetworkNone && r.spec.From.Debian == nil && slices.ContainsFunc(r.spec.Steps, func(st api.TemplateStep) bool { return st.Type == api.StepRun }) {
		r.logf(levelWarn, "RUN steps have no network: this server runs without sandbox networking "+
			"(kiln serve --network, or KILN_NETWORK=on, lets them reach package mirrors)")
	}
	for i, st := range r.spec.Steps {
		r.step = i
		if err := r.runStep(ctx, i, st); err != nil {
			return err
		}
		if err := checkStack(r.dirs); err != nil {
			return err
		}
	}
	r.step, r.stage = -1, "finalize"
	return r.finalize(ctx)
}

// maxLowerBytes bounds the overlay lowerdir option of a template's layer
// stack: the mount options of a sandbox's root filesystem (with its upper
// and work dirs) must fit in one page.
const maxLowerBytes = 3500

// checkStack refuses a layer stack too deep to mount.
func checkStack(dirs []string) error {
	if n := len(template.Lower(dirs)); n > maxLowerBytes {
		return fmt.Errorf("the template has %d layers, more than a sandbox's root filesystem can stack (combine RUN steps, or start from a base with fewer layers): %w",
			len(dirs), errdefs.ErrResourceExhausted)
	}
	return nil
}

// push adds a layer on top of the stack; l is nil for a built-in's rootfs.
func (r *run) push(l *layer.Layer, key, dir string) {
	if l != nil {
		r.leased = append(r.leased, l)
	}
	r.keys = append(r.keys, key)
	r.dirs = append(r.dirs, dir)
}

// lower is the stack as an overlay's lower dirs, top first.
func (r *run) lower() []string {
	l := slices.Clone(r.dirs)
	slices.Reverse(l)
	return l
}

// parent is the key of the top layer.
func (r *run) parent() string { return r.keys[len(r.keys)-1] }

// key is the cache key of step on the current stack. A forced step (and
// every one after it) is keyed apart, by the build, so that it is rebuilt
// and never replaces the layer an unforced build would find.
func (r *run) key(st api.TemplateStep, extra ...string) string {
	if r.force {
		extra = append(extra, "force="+r.rec.ID)
	}
	return layer.Key(r.parent(), st, extra...)
}

// cached pushes the layer published under key unless the step is forced;
// it reports whether it did.
func (r *run) cached(key, what string) (bool, error) {
	if r.force {
		return false, nil
	}
	l, err := r.b.cfg.Layers.Acquire(key)
	if errors.Is(err, errdefs.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	r.push(l, key, l.Dir())
	r.hit = true
	r.logf(levelInfo, "%s CACHED", what)
	return true, nil
}

// finalize writes the build's manifest and records it ready, then points
// the tags at it.
func (r *run) finalize(ctx context.Context) error {
	if r.mkWorkdir {
		r.logf(levelInfo, "[finalize] making the working directory %s", r.workdir)
		if err := r.runCmd(ctx, "[finalize]", api.TemplateStep{Type: api.StepRun, Args: []string{"true"}}, "root"); err != nil {
			return err
		}
	}
	t := r.b.manifest(r.rec.Template, r.rec.ID, r.dirs, r.cfg)
	if err := template.WriteManifest(r.b.buildDir(r.rec.ID), t); err != nil {
		return r.hide("writing the template manifest", err)
	}
	if t.Warm != nil {
		built, err := r.b.cfg.Catalog.Build(r.rec.ID) // as sandboxes will see it
		if err != nil {
			return r.hide("reading the template manifest", err)
		}
		if err := r.warm(ctx, built, r.adoptWarm(ctx, built)); err != nil {
			return err
		}
	}
	rec := r.rec
	rec.Layers, rec.Config = r.keys, r.cfg
	if r.b.cfg.ClusterRegistry != "" {
		ref, err := r.pushToCluster(ctx, rec)
		if err != nil {
			return err
		}
		rec.Image = ref
	}
	rec.Status, rec.FinishedAt = template.BuildReady, time.Now().UTC()
	if err := r.b.cfg.Records.PutBuild(ctx, rec); err != nil {
		return fmt.Errorf("recording the build: %w", err)
	}
	r.rec = rec
	for _, tag := range r.tags {
		tr := template.TagRecord{Owner: rec.Owner, Name: rec.Template, Tag: tag, BuildID: rec.ID, Public: r.public, UpdatedAt: rec.FinishedAt}
		if err := r.b.cfg.Records.PutTag(ctx, tr); err != nil {
			return fmt.Errorf("tagging the build %s:%s: %w", rec.Template, tag, err)
		}
	}
	return nil
}

// manifest is the template that the build id of template name is: its
// layer dirs, bottom first, and what its sandboxes start with (a
// template with a start command is a warm one).
func (b *Builder) manifest(name, id string, dirs []string, c template.Config) *template.Template {
	d := c.Defaults
	d.Env = maps.Clone(d.Env)
	t := &template.Template{Name: name, Hash: id, Build: id, Layers: slices.Clone(dirs), Defaults: d}
	if c.StartCmd != "" {
		t.Warm = &template.Warm{Start: c.StartCmd, Ready: c.ReadyCmd, Cwd: d.Workdir,
			TimeoutSeconds: int((b.cfg.ReadyTimeout + time.Second - 1) / time.Second)}
	}
	return t
}

// warm takes the template's warm snapshot: a sandbox of it runs the start
// command, the ready command is retried until it succeeds, and the running
// sandbox is checkpointed (runsc); sandboxes of the template are then
// restored from it, the started process already running.
// adopted says t has an earlier build's snapshot, which is used if it
// suits this server's runtime and agent.
func (r *run) warm(ctx context.Context, t *template.Template, adopted bool) error {
	if r.b.cfg.Images == nil || !r.b.cfg.Images.CanWarm() {
		r.logf(levelWarn, "[finalize] no warm snapshot: this server cannot checkpoint sandboxes")
		return nil
	}
	if !adopted {
		r.logf(levelInfo, "[finalize] start %s; ready when %s", errdefs.ClipN(t.Warm.Start, 200), errdefs.ClipN(t.Warm.Ready, 200))
	}
	t0 := time.Now()
	if _, err := r.b.cfg.Images.BuildWarmTemplate(ctx, t); err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			return &stepError{msg: fmt.Sprintf("the ready command %q did not succeed within %s", errdefs.ClipN(t.Warm.Ready, 200), r.b.cfg.ReadyTimeout),
				class: errdefs.ErrFailedPrecondition}
		}
		return r.hide("taking the warm snapshot", err)
	}
	r.logf(levelInfo, "[finalize] warm snapshot taken in %s", since(t0))
	return nil
}

// adoptWarm gives t the warm snapshot of an earlier ready build of the
// same template with the same layers and config (a rebuild that changed
// nothing), so that warm finds it instead of starting the template again.
func (r *run) adoptWarm(ctx context.Context, t *template.Template) bool {
	recs, err := r.b.cfg.Records.ListBuilds(ctx, r.rec.Owner, r.rec.Template, 20)
	if err != nil {
		return false
	}
	cfg, _ := json.Marshal(r.cfg)
	for _, p := range recs {
		pcfg, _ := json.Marshal(p.Config)
		if p.ID == r.rec.ID || p.Status != template.BuildReady || !slices.Equal(p.Layers, r.keys) || !bytes.Equal(pcfg, cfg) {
			continue
		}
		prev, err := r.b.cfg.Catalog.Build(p.ID)
		if err != nil || !reflect.DeepEqual(prev.Warm, t.Warm) {
			continue
		}
		if n := t.AdoptCheckpoints(prev); n > 0 {
			r.logf(levelInfo, "[finalize] reusing the warm snapshot of build %s (the same layers and start)", p.ID)
			return true
		}
	}
	return false
}

// fail records the build failed, with a reason naming the step and the
// tail of its output, and collects the layers nothing else references.
func (r *run) fail(ctx context.Context, err error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	msg := err.Error()
	switch {
	case errors.Is(err, context.DeadlineExceeded) && r.b.ctx.Err() == nil:
		msg = fmt.Sprintf("the build took longer than its %s limit", r.b.cfg.BuildTimeout)
	case errors.Is(err, context.Canceled) && r.b.ctx.Err() != nil:
		msg = "kiln serve stopped during the build"
	}
	where := r.stage
	if r.step >= 0 {
		where = stepName(r.step, r.spec.Steps[r.step])
	}
	reason := where + ": " + msg
	var se *stepError
	if errors.As(err, &se) && se.tail != "" {
		reason += "\n" + se.tail
	}
	r.logEvent(api.LogError, levelError, "build failed: %s", reason)
	rec := r.rec
	rec.Status, rec.Reason, rec.Step, rec.FinishedAt = template.BuildError, reason, r.step, time.Now().UTC()
	rec.Layers = nil
	if perr := r.b.cfg.Records.PutBuild(ctx, rec); perr != nil {
		r.b.log.Error("recording a failed build", "build", rec.ID, "err", perr)
	}
	r.b.log.Info("build failed", "build", rec.ID, "template", rec.Template, "reason", errdefs.ClipN(reason, 200))
	// The manifest and warm snapshot of a build that did not finish go:
	// only the record and the log stay.
	dir := r.b.buildDir(rec.ID)
	_ = os.Remove(filepath.Join(dir, "template.json"))
	_ = os.RemoveAll(filepath.Join(dir, "warm"))
	r.release()
	if gerr := r.b.GC(ctx); gerr != nil {
		r.b.log.Warn("collecting a failed build's layers", "build", rec.ID, "err", gerr)
	}
}

// release ends the build's leases.
func (r *run) release() {
	for _, l := range r.leased {
		_ = l.Release()
	}
	r.leased = nil
}

// tail keeps the last lines of a step's output for its failure reason,
// and the last lines of its standard error apart: stdout and stderr are
// two pipes, so an error a command printed last (apt's "E: Unable to
// locate package") may arrive before its final stdout lines and fall out
// of the window.
type tail struct{ lines, errs []string }

const (
	tailLines    = 20
	tailErrLines = 5
)

func newTail() *tail { return &tail{} }

func (t *tail) add(line string) { t.lines = last(append(t.lines, line), tailLines) }

// addErr adds a line of standard error.
func (t *tail) addErr(line string) {
	t.add(line)
	t.errs = last(append(t.errs, line), tailErrLines)
}

func last(lines []string, n int) []string { return lines[max(len(lines)-n, 0):] }

func (t *tail) reset() { t.lines, t.errs = nil, nil }

// String is the window of last lines, then those of the last stderr
// lines that are not in it.
func (t *tail) String() string {
	out := slices.Clone(t.lines)
	for _, e := range t.errs {
		if !slices.Contains(t.lines, e) {
			out = append(out, e)
		}
	}
	return strings.Join(out, "\n")
}
