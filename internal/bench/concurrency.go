package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
)

// ConcurrencyResult is create → first `true` latency with c creates in
// flight at once.
type ConcurrencyResult struct {
	Runtime     string `json:"runtime"`
	Concurrency int    `json:"concurrency"`
	Create      Dist   `json:"create_first_true"`
	Errors      int    `json:"errors"`
	FirstError  string `json:"first_error,omitempty"`
	// CPU is host CPU per create (in-process Manager only): from the
	// rounds' starts to their last create's first `true`, kills excluded.
	CPU *CreateCPU `json:"cpu_per_create,omitempty"`
	// Rate is creates per second of the rounds' wall time.
	Rate float64 `json:"creates_per_s"`
}

// ConcurrencyResults is the concurrent-create section.
type ConcurrencyResults struct {
	Target  string              `json:"target"`
	Results []ConcurrencyResult `json:"results"`
}

// Concurrency creates sandboxes on t at each level of concurrency: rounds
// of `level` creates started together (at least samples creates per
// level), each followed by a `true`; each round is killed before the next.
func Concurrency(ctx context.Context, t Target, runtimes []string, levels []int, samples int, progress io.Writer) (*ConcurrencyResults, error) {
	res := &ConcurrencyResults{Target: t.String()}
	for _, rt := range runtimes {
		for _, c := range levels {
			fmt.Fprintf(progress, "bench: %s: creates at concurrency %d\n", rt, c)
			r := ConcurrencyResult{Runtime: rt, Concurrency: c}
			var lat []time.Duration
			var cpu CreateCPU
			var wall time.Duration
			rounds := 0
			for done := 0; done < max(samples, c); done += c {
				ids := make([]string, c)
				d := make([]time.Duration, c)
				errs := make([]error, c)
				var wg sync.WaitGroup
				before, t0 := processCPU(), time.Now()
				for i := range c {
					wg.Go(func() {
						start := time.Now()
						ids[i], errs[i] = t.Create(ctx, rt)
						d[i] = time.Since(start)
					})
				}
				wg.Wait()
				wall += time.Since(t0)
				after := processCPU()
				after.Sandboxes = sandboxesCPU(ids)
				per := perCreate(before, after, c)
				cpu.Kiln += per.Kiln
				cpu.Commands += per.Commands
				cpu.Sandboxes += per.Sandboxes
				rounds++
				for i := range c {
					if ids[i] != "" {
						if err := t.Kill(context.WithoutCancel(ctx), ids[i]); err != nil && errs[i] == nil {
							errs[i] = err
						}
					}
					if errs[i] != nil {
						r.Errors++
						if r.FirstError == "" {
							r.FirstError = errs[i].Error()
						}
						continue
					}
					lat = append(lat, d[i])
				}
				if ctx.Err() != nil {
					return res, ctx.Err()
				}
			}
			r.Create = dist(lat)
			if wall > 0 {
				r.Rate = float64(rounds*c) / wall.Seconds()
			}
			if _, ok := t.(managerTarget); ok && rounds > 0 {
				r.CPU = &CreateCPU{Kiln: cpu.Kiln / time.Duration(rounds), Commands: cpu.Commands / time.Duration(rounds), Sandboxes: cpu.Sandboxes / time.Duration(rounds)}
			}
			res.Results = append(res.Results, r)
			if len(lat) == 0 {
				return res, errors.New("no create succeeded: " + r.FirstError)
			}
		}
	}
	return res, nil
}

// WriteMarkdown renders the concurrent-create section.
func (r *ConcurrencyResults) WriteMarkdown(w io.Writer) {
	fmt.Fprintf(w, "\n## Create latency under concurrency\n\n")
	fmt.Fprintf(w, "Create → first `true` with N creates started together (%s); every sandbox is killed after its round.\n\n", r.Target)
	fmt.Fprintf(w, "| runtime | concurrency | samples | p50 | p95 | p99 | max | creates/s | errors | host CPU per create: kiln | commands | sandboxes | total |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, c := range r.Results {
		var cpu CreateCPU
		if c.CPU != nil {
			cpu = *c.CPU
		}
		fmt.Fprintf(w, "| %s | %d | %d | %s | %s | %s | %s | %.1f | %d | %s | %s | %s | %s |\n", c.Runtime, c.Concurrency, c.Create.N,
			ms(c.Create.P50), ms(c.Create.P95), ms(c.Create.P99), ms(c.Create.Max), c.Rate, c.Errors,
			ms(cpu.Kiln), ms(cpu.Commands), ms(cpu.Sandboxes), ms(cpu.Total()))
	}
	fmt.Fprintf(w, "\n*Host CPU per create* (in-process Manager only): user + system time from a round's start to its last create's first `true`, per create: *kiln* is the Manager's own Go code (store, mounts, bundle, handshake, the command), *commands* what it ran and waited for (`runsc create`/`start`/`state`, `mkfs.ext4`), *sandboxes* what the sandboxes' cgroups were charged (runsc's Sentry booting and running the agent, and its gofer).\n")
}
