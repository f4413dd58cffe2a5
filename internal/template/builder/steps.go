package builder

import (
	"context"
	"fmt"
	"os"
	"path"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/template/layer"
)

// describe renders a step as its log line says it: "RUN apt-get install
// -y cowsay", "COPY data.csv /data/", "ENV A=1 B=2".
func describe(st api.TemplateStep) string {
	var s string
	switch st.Type {
	case api.StepEnv:
		var kv []string
		for i := 0; i+1 < len(st.Args); i += 2 {
			kv = append(kv, st.Args[i]+"="+st.Args[i+1])
		}
		s = strings.Join(kv, " ")
	case api.StepRun:
		s = st.Args[0]
		if len(st.Args) > 1 && st.Args[1] != "" {
			s += " (as " + st.Args[1] + ")"
		}
	case api.StepCopy, api.StepAdd:
		s = st.Args[0] + " " + st.Args[1]
	default:
		s = strings.Join(st.Args, " ")
	}
	s = strings.ReplaceAll(s, "\n", " ")
	return st.Type + " " + errdefs.ClipN(s, 200)
}

// runStep applies step i to the build.
func (r *run) runStep(ctx context.Context, i int, st api.TemplateStep) error {
	if st.Force {
		r.force = true
	}
	what := fmt.Sprintf("[%d/%d] %s", i+1, len(r.spec.Steps), describe(st))
	switch st.Type {
	case api.StepEnv:
		for j := 0; j < len(st.Args); j += 2 {
			v, err := expandWord(st.Args[j+1], r.cfg.Env)
			if err != nil {
				return fmt.Errorf("%s: %w: %w", st.Args[j], err, errdefs.ErrInvalidArgument)
			}
			r.cfg.Env[st.Args[j]] = v
		}
		r.logf(levelInfo, "%s", what)
	case api.StepWorkdir:
		r.workdir = path.Clean(resolvePath(r.workdir, st.Args[0]))
		r.cfg.Workdir, r.workdirSet, r.mkWorkdir = r.workdir, true, true
		r.logf(levelInfo, "%s", what)
	case api.StepUser:
		r.user, r.cfg.User = st.Args[0], st.Args[0]
		r.logf(levelInfo, "%s", what)
	case api.StepCopy, api.StepAdd:
		return r.observe(r.copy(ctx, what, st), true)
	case api.StepRun:
		user := r.user
		if len(st.Args) > 1 && st.Args[1] != "" {
			user = st.Args[1]
		}
		return r.observe(r.runCmd(ctx, what, st, user), true)
	}
	return r.observe(nil, false)
}

// copy makes a COPY/ADD step's layer on the host from its uploaded files.
func (r *run) copy(ctx context.Context, what string, st api.TemplateStep) error {
	st.Args = slices.Clone(st.Args)
	st.Args[1] = resolvePath(r.workdir, st.Args[1])
	key := r.key(st)
	if ok, err := r.cached(key, what); ok || err != nil {
		return err
	}
	r.logf(levelInfo, "%s", what)
	t0 := time.Now()
	p := r.b.filesPath(r.rec.Owner, st.FilesHash)
	fi, err := os.Stat(p)
	if err != nil {
		return fmt.Errorf("the files of %s (%.12s) were not uploaded: %w", st.Args[0], st.FilesHash, errdefs.ErrInvalidArgument)
	}
	if fi.Size() > r.b.cfg.MaxContextBytes {
		return fmt.Errorf("the files of %s are %d bytes, over the %d allowed: %w", st.Args[0], fi.Size(), r.b.cfg.MaxContextBytes, errdefs.ErrResourceExhausted)
	}
	f, err := os.Open(p)
	if err != nil {
		return r.hide("opening the files of "+st.Args[0], err)
	}
	defer f.Close()
	pend, err := r.b.cfg.Layers.Create()
	if err != nil {
		return r.hide("making a layer", err)
	}
	err = layer.Copy(ctx, pend.Dir(), layer.CopyParams{Step: st, Files: f, Lower: r.lower(), Limit: r.b.cfg.MaxLayerBytes, Log: r.b.log})
	if err != nil {
		_ = pend.Discard()
		return err
	}
	l, err := pend.Publish(ctx, key)
	if err != nil {
		_ = pend.Discard()
		return r.hide("storing the layer", err)
	}
	r.push(l, key, l.Dir())
	r.logEvent(api.LogDone, levelInfo, "%s done in %s", stepTag(what), since(t0))
	return nil
}

// runKey is the cache key of a RUN of st as user on the current stack:
// the result depends on the user, workdir and environment it runs with.
func (r *run) runKey(st api.TemplateStep, user string) string {
	keys := make([]string, 0, len(r.cfg.Env))
	for k := range r.cfg.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var env strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&env, "%d:%s=%s\n", len(k)+1+len(r.cfg.Env[k]), k, r.cfg.Env[k])
	}
	return r.key(st, "user="+user, "workdir="+r.workdir, "env="+env.String())
}

// runCmd runs a RUN step (st.Args[0]) as user, or finds its layer.
func (r *run) runCmd(ctx context.Context, what string, st api.TemplateStep, user string) error {
	key := r.runKey(st, user)
	if ok, err := r.cached(key, what); ok || err != nil {
		if ok {
			r.mkWorkdir = false
		}
		return err
	}
	r.logf(levelInfo, "%s", what)
	t0 := time.Now()
	l, err := r.sandboxRun(ctx, st.Args[0], user, key)
	if err != nil {
		return err
	}
	r.push(l, key, l.Dir())
	r.mkWorkdir = false
	r.logEvent(api.LogDone, levelInfo, "%s done in %s", stepTag(what), since(t0))
	return nil
}

// stepTag is the "[3/7]" of a step's line.
func stepTag(what string) string {
	if i := strings.IndexByte(what, ']'); i > 0 {
		return what[:i+1]
	}
	return what
}

func since(t time.Time) string { return time.Since(t).Round(10 * time.Millisecond).String() }
