package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// WarmResult compares the three ways a code-interpreter sandbox comes to
// be on runsc: booted cold, restored from the template's warm checkpoint
// (kernel up, pandas imported), and claimed from a warm pool.
type WarmResult struct {
	Template        string `json:"template"`
	Samples         int    `json:"samples"`
	CheckpointBytes int64  `json:"checkpoint_bytes"` // memory image of the warm checkpoint
	WarmBuild       string `json:"warm_build"`       // how long building it took

	ColdCreate   Dist    `json:"cold_create"`       // Create returned
	ColdFirst    Dist    `json:"cold_first_result"` // create → first `1+1` (kernel starts, no pandas)
	ColdPandas   Dist    `json:"cold_pandas_ready"` // create → pandas, numpy, pyplot imported, `1+1`
	WarmCreate   Dist    `json:"warm_create"`       // Create returned (restore)
	WarmFirst    Dist    `json:"warm_first_result"` // create → first `1+1`, pandas already imported
	PoolCreate   Dist    `json:"pool_create"`       // Create returned (claim)
	PoolFirst    Dist    `json:"pool_first_result"` // create → first `1+1`, pandas already imported
	PoolEnvFirst Dist    `json:"pool_env_first"`    // claim with a create env var, → first `1+1`
	PoolEnv      Dist    `json:"pool_env_create"`   // Create returned, with a create env var
	PoolHitRate  float64 `json:"pool_hit_rate"`
}

// Warm measures creates of the template (code-interpreter) on runsc:
// n cold, n from its warm checkpoint (built first if missing) and n from
// a pool of one, each followed by a first `1+1`.
func Warm(ctx context.Context, m *sandbox.Manager, im *sandbox.Images, tmpl string, n int, progress io.Writer) (*WarmResult, error) {
	r := &WarmResult{Template: tmpl, Samples: n}
	fmt.Fprintf(progress, "bench: warm checkpoint of %s\n", tmpl)
	c, err := im.BuildWarm(ctx, tmpl)
	if err != nil {
		return nil, err
	}
	r.WarmBuild = c.Took
	_ = filepath.Walk(c.Image(), func(_ string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			r.CheckpointBytes += fi.Size()
		}
		return nil
	})

	// one creates a sandbox, runs 1+1 (and more), and destroys it.
	one := func(opts sandbox.CreateOptions, pandasWanted bool, extra string) (create, first, ready time.Duration, err error) {
		opts.Template, opts.Runtime = tmpl, "runsc"
		start := time.Now()
		sb, err := m.Create(ctx, opts)
		if err != nil {
			return 0, 0, 0, err
		}
		create = time.Since(start)
		defer m.Kill(context.WithoutCancel(ctx), sb.ID)
		a, err := m.Agent(sb.ID)
		if err != nil {
			return 0, 0, 0, err
		}
		if out, err := python(ctx, a, "1+1"); err != nil || out != "2" {
			return 0, 0, 0, fmt.Errorf("1+1 = %q: %v", out, err)
		}
		first = time.Since(start)
		if extra != "" {
			if _, err := python(ctx, a, extra); err != nil {
				return 0, 0, 0, err
			}
		}
		ready = time.Since(start)
		// Not timed: check that the sandbox was what it was meant to be.
		if out, err := python(ctx, a, "'pandas' in __import__('sys').modules"); err != nil || (out == "True") != pandasWanted {
			return 0, 0, 0, fmt.Errorf("pandas imported = %s (want %v): %v", out, pandasWanted, err)
		}
		return create, first, ready, nil
	}

	var cc, cf, cp, wc, wf []time.Duration
	fmt.Fprintf(progress, "bench: %d cold creates of %s\n", n, tmpl)
	for range n {
		create, first, ready, err := one(sandbox.CreateOptions{Cold: true}, true, "import pandas, numpy, matplotlib.pyplot")
		if err != nil {
			return nil, fmt.Errorf("cold create: %w", err)
		}
		cc, cf, cp = append(cc, create), append(cf, first), append(cp, ready)
	}
	fmt.Fprintf(progress, "bench: %d creates of %s from its warm checkpoint\n", n, tmpl)
	for range n {
		create, first, _, err := one(sandbox.CreateOptions{}, true, "")
		if err != nil {
			return nil, fmt.Errorf("warm create: %w", err)
		}
		wc, wf = append(wc, create), append(wf, first)
	}
	r.ColdCreate, r.ColdFirst, r.ColdPandas = dist(cc), dist(cf), dist(cp)
	r.WarmCreate, r.WarmFirst = dist(wc), dist(wf)

	fmt.Fprintf(progress, "bench: %d creates of %s from a pool of 1\n", 2*n, tmpl)
	im.StartPools(map[string]int{tmpl: 1})
	defer im.StopPools()
	var pc, pf, ec, ef []time.Duration
	for i := range 2 * n {
		if err := waitPool(ctx, im, tmpl); err != nil {
			return nil, err
		}
		opts := sandbox.CreateOptions{}
		if i%2 == 1 {
			opts.Env = map[string]string{"BENCH_RUN": fmt.Sprint(i)}
		}
		create, first, _, err := one(opts, true, "")
		if err != nil {
			return nil, fmt.Errorf("pool create: %w", err)
		}
		if i%2 == 1 {
			ec, ef = append(ec, create), append(ef, first)
		} else {
			pc, pf = append(pc, create), append(pf, first)
		}
	}
	r.PoolCreate, r.PoolFirst, r.PoolEnv, r.PoolEnvFirst = dist(pc), dist(pf), dist(ec), dist(ef)
	for _, s := range im.PoolStats() {
		if s.Template == tmpl && s.Hits+s.Misses > 0 {
			r.PoolHitRate = float64(s.Hits) / float64(s.Hits+s.Misses)
		}
	}
	return r, nil
}

// waitPool waits until the template's pool is full.
func waitPool(ctx context.Context, im *sandbox.Images, tmpl string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	for {
		for _, s := range im.PoolStats() {
			if s.Template == tmpl && s.Ready >= s.Target {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the %s pool to fill: %w", tmpl, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// python runs code in the default Python context and returns its main
// result as text.
func python(ctx context.Context, a *sandbox.Agent, code string) (string, error) {
	var out string
	var failed *api.ExecutionError
	_, err := a.Execute(ctx, wire.ExecuteParams{Language: "python", Code: code, TimeoutMs: 120_000}, func(ev api.Event) error {
		switch {
		case ev.Result != nil && ev.Result.IsMainResult:
			out = ev.Result.Data["text/plain"]
		case ev.ExecutionError != nil:
			failed = ev.ExecutionError
		}
		return nil
	})
	if err == nil && failed != nil {
		err = fmt.Errorf("%s: %s", failed.Name, failed.Value)
	}
	return out, err
}

// WriteMarkdown renders the section for docs/benchmarks.md.
func (r *WarmResult) WriteMarkdown(w io.Writer) {
	fmt.Fprintf(w, "\n## Warm templates and pools (runsc, `%s`)\n\n", r.Template)
	fmt.Fprintf(w, "`kiln bench --warm`: %d sandboxes each way, destroyed after use. The warm checkpoint (kernel started, "+
		"`import numpy, pandas, matplotlib.pyplot` done) has a %s memory image and took %s to build.\n\n", r.Samples, mib(r.CheckpointBytes), r.WarmBuild)
	fmt.Fprintf(w, "| how | `Create` p50 | p95 | create → first `1+1` p50 | p95 | target |\n|---|---|---|---|---|---|\n")
	fmt.Fprintf(w, "| cold boot (kernel starts on the first execution; pandas not imported) | %s | %s | %s | %s | |\n",
		ms(r.ColdCreate.P50), ms(r.ColdCreate.P95), ms(r.ColdFirst.P50), ms(r.ColdFirst.P95))
	fmt.Fprintf(w, "| cold boot, then `import pandas, numpy, matplotlib.pyplot` (what warm saves) | | | %s | %s | |\n",
		ms(r.ColdPandas.P50), ms(r.ColdPandas.P95))
	fmt.Fprintf(w, "| warm template (restore of the checkpoint; pandas imported) | %s | %s | %s | %s | first `1+1` ≤ 400 ms |\n",
		ms(r.WarmCreate.P50), ms(r.WarmCreate.P95), ms(r.WarmFirst.P50), ms(r.WarmFirst.P95))
	fmt.Fprintf(w, "| pool of 1 (claim; pandas imported) | %s | %s | %s | %s | create ≤ 20 ms |\n",
		ms(r.PoolCreate.P50), ms(r.PoolCreate.P95), ms(r.PoolFirst.P50), ms(r.PoolFirst.P95))
	fmt.Fprintf(w, "| pool of 1, create request with an env var | %s | %s | %s | %s | |\n",
		ms(r.PoolEnv.P50), ms(r.PoolEnv.P95), ms(r.PoolEnvFirst.P50), ms(r.PoolEnvFirst.P95))
	fmt.Fprintf(w, "\nPool hit rate %.0f %% (the bench waits for the refill, a restore of the checkpoint, before each create). ", 100*r.PoolHitRate)
	fmt.Fprintf(w, "A claim records the sandbox; with env in the request it also calls the agent's identify, which "+
		"queues the warm kernel's `os.environ` update ahead of the first execution (so the first `1+1` waits for it, the create does not).\n")
}
