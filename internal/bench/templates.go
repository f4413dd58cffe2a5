package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/template"
	"github.com/kiln-sh/kiln/internal/template/builder"
	"github.com/kiln-sh/kiln/internal/template/dockerfile"
)

// CowsayDockerfile is the custom template of the templates benchmark:
// E2B's custom-package flow (a Debian package on top of the code
// interpreter, a data file, ENV, WORKDIR). Its build is the one benchmark
// that reaches the network (the Debian mirror).
const CowsayDockerfile = `FROM code-interpreter
RUN apt-get update && apt-get install -y --no-install-recommends cowsay
COPY data.csv /home/user/data.csv
ENV GREETING="hello from kiln"
WORKDIR /home/user/work
`

// TemplatesResult measures custom templates on runsc: the first build of
// CowsayDockerfile (with a start command, so it has a warm snapshot) and
// its rebuild with nothing changed, then creates of it, each followed by
// its first command (`cowsay hi`): booted cold, restored from the warm
// snapshot, and claimed from a pool of one.
type TemplatesResult struct {
	Samples     int    `json:"samples"`
	Steps       int    `json:"steps"`
	FirstBuild  string `json:"first_build"`  // build requested → ready, nothing cached (warm snapshot included)
	CachedBuild string `json:"cached_build"` // the same, every step CACHED
	CachedSteps int    `json:"cached_steps"` // steps of the rebuild found in the layer cache

	ColdCreate Dist `json:"cold_create"`
	ColdFirst  Dist `json:"cold_first_command"` // create → first command's exit
	WarmCreate Dist `json:"warm_create"`
	WarmFirst  Dist `json:"warm_first_command"`
	PoolCreate Dist `json:"pool_create"`
	PoolFirst  Dist `json:"pool_first_command"`
}

// TemplatesEnv is what the templates benchmark builds with: a Builder
// whose build sandboxes have NAT networking and whose layer store and
// records are fresh (so the first build caches nothing), over m and im.
type TemplatesEnv struct {
	Builder  *builder.Builder
	Manager  *sandbox.Manager
	Images   *sandbox.Images
	FilesDir string // scratch dir for the build context
}

// Templates runs the templates benchmark with n creates per way.
func Templates(ctx context.Context, env TemplatesEnv, n int, progress io.Writer) (*TemplatesResult, error) {
	const owner, ref = "bench", "bench-cowsay"
	r := &TemplatesResult{Samples: n}
	spec, err := uploadDockerfile(env.Builder, owner, env.FilesDir, CowsayDockerfile, map[string]string{"data.csv": "x,y\n1,2\n"})
	if err != nil {
		return nil, err
	}
	spec.StartCmd = "exec python3 -m http.server 8080"
	spec.ReadyCmd = "echo > /dev/tcp/127.0.0.1/8080"
	r.Steps = len(spec.Steps)
	build := func(what string) (template.BuildRecord, error) {
		fmt.Fprintf(progress, "bench: %s of the cowsay Dockerfile\n", what)
		rec, err := env.Builder.Start(ctx, owner, ref, *spec, false)
		if err != nil {
			return rec, err
		}
		if rec, err = env.Builder.Wait(ctx, rec.ID); err != nil {
			return rec, err
		}
		if rec.Status != template.BuildReady {
			return rec, fmt.Errorf("%s: %s: %s", what, rec.Status, rec.Reason)
		}
		return rec, nil
	}
	first, err := build("first build")
	if err != nil {
		return nil, err
	}
	second, err := build("cached rebuild")
	if err != nil {
		return nil, err
	}
	if !slices.Equal(first.Layers, second.Layers) {
		return nil, fmt.Errorf("the rebuild made new layers: %v, first build %v", second.Layers, first.Layers)
	}
	r.FirstBuild = first.FinishedAt.Sub(first.CreatedAt).Round(time.Millisecond).String()
	r.CachedBuild = second.FinishedAt.Sub(second.CreatedAt).Round(time.Millisecond).String()
	r.CachedSteps = second.CachedSteps

	// one creates a sandbox, runs the first command and destroys it.
	one := func(opts sandbox.CreateOptions) (create, first time.Duration, err error) {
		opts.Template, opts.Owner, opts.Runtime = ref, owner, "runsc"
		start := time.Now()
		sb, err := env.Manager.Create(ctx, opts)
		if err != nil {
			return 0, 0, err
		}
		create = time.Since(start)
		defer env.Manager.Kill(context.WithoutCancel(ctx), sb.ID)
		a, err := env.Manager.Agent(sb.ID)
		if err != nil {
			return 0, 0, err
		}
		var out strings.Builder
		exit, err := a.Exec(ctx, wire.ExecParams{Args: []string{"/usr/games/cowsay", "hi"}, User: sb.User, Cwd: sb.Workdir, Env: sb.Env},
			func(ev api.Event) error {
				if ev.Type == api.EventStdout {
					out.Write(ev.Data)
				}
				return nil
			})
		if err != nil || exit.Code != 0 || !strings.Contains(out.String(), "< hi >") {
			return 0, 0, fmt.Errorf("cowsay hi: exit %d, %q: %v", exit.Code, out.String(), err)
		}
		return create, time.Since(start), nil
	}
	ways := []struct {
		name          string
		opts          sandbox.CreateOptions
		create, first *Dist
		pool          bool
	}{
		{"cold", sandbox.CreateOptions{Cold: true}, &r.ColdCreate, &r.ColdFirst, false},
		{"warm snapshot", sandbox.CreateOptions{}, &r.WarmCreate, &r.WarmFirst, false},
		{"pool of 1", sandbox.CreateOptions{}, &r.PoolCreate, &r.PoolFirst, true},
	}
	for _, w := range ways {
		fmt.Fprintf(progress, "bench: %d creates of the cowsay template, %s\n", n, w.name)
		if w.pool {
			env.Images.StartPools(map[string]int{ref: 1})
			defer env.Images.StopPools()
		}
		var cs, fs []time.Duration
		for range n {
			if w.pool {
				if err := waitPool(ctx, env.Images, ref); err != nil {
					return nil, err
				}
			}
			c, f, err := one(w.opts)
			if err != nil {
				return nil, fmt.Errorf("%s create: %w", w.name, err)
			}
			cs, fs = append(cs, c), append(fs, f)
		}
		*w.create, *w.first = dist(cs), dist(fs)
	}
	return r, nil
}

// uploadDockerfile compiles a Dockerfile whose context holds files, and
// stores, as owner's uploads, the files each COPY/ADD step needs, as the
// client does.
func uploadDockerfile(b *builder.Builder, owner, scratch, df string, files map[string]string) (*api.TemplateSpec, error) {
	dir, err := os.MkdirTemp(scratch, "context-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			return nil, err
		}
	}
	spec, _, err := dockerfile.Compile([]byte(df), dockerfile.Options{IsTemplate: template.ValidName})
	if err != nil {
		return nil, err
	}
	bc, err := dockerfile.OpenContext(dir)
	if err != nil {
		return nil, err
	}
	defer bc.Close()
	if err := bc.HashSteps(spec.Steps); err != nil {
		return nil, err
	}
	for _, st := range spec.Steps {
		if st.FilesHash == "" {
			continue
		}
		if err := storeUpload(b, owner, st.FilesHash, func(w io.Writer) error { return bc.WriteTar(w, st.Args[0]) }); err != nil {
			return nil, err
		}
	}
	return spec, nil
}

func storeUpload(b *builder.Builder, owner, hash string, write func(io.Writer) error) error {
	p, err := b.FilesPath(owner, hash)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	f, err := os.Create(p)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// WriteMarkdown renders the section for docs/benchmarks.md.
func (r *TemplatesResult) WriteMarkdown(w io.Writer) {
	fmt.Fprintf(w, "\n## Custom templates (runsc)\n\n")
	fmt.Fprintf(w, "`kiln bench --templates`: the cowsay Dockerfile (`FROM code-interpreter`, `RUN apt-get install cowsay` "+
		"from the Debian mirror, COPY, ENV, WORKDIR; start command `python3 -m http.server 8080` with a ready check, so the build "+
		"takes a warm snapshot), built into an empty layer store, then rebuilt unchanged; then %d creates each way, each followed "+
		"by the first command `cowsay hi`.\n\n", r.Samples)
	fmt.Fprintf(w, "| build | took | target |\n|---|---|---|\n")
	fmt.Fprintf(w, "| first build (%d steps, warm snapshot included) | %s | ≤ 30 s |\n", r.Steps, r.FirstBuild)
	fmt.Fprintf(w, "| rebuild, nothing changed (the same layers: every step CACHED) | %s | ≤ 2 s |\n\n", r.CachedBuild)
	fmt.Fprintf(w, "| create | `Create` p50 | p95 | create → first command p50 | p95 | target |\n|---|---|---|---|---|---|\n")
	fmt.Fprintf(w, "| cold boot | %s | %s | %s | %s | |\n", ms(r.ColdCreate.P50), ms(r.ColdCreate.P95), ms(r.ColdFirst.P50), ms(r.ColdFirst.P95))
	fmt.Fprintf(w, "| warm snapshot (restore, web server running) | %s | %s | %s | %s | create ≤ 100 ms |\n",
		ms(r.WarmCreate.P50), ms(r.WarmCreate.P95), ms(r.WarmFirst.P50), ms(r.WarmFirst.P95))
	fmt.Fprintf(w, "| pool of 1 (claim) | %s | %s | %s | %s | |\n", ms(r.PoolCreate.P50), ms(r.PoolCreate.P95), ms(r.PoolFirst.P50), ms(r.PoolFirst.P95))
}
