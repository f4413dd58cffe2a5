package bench

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/kiln-sh/kiln/internal/sandbox"
)

// DensityResult is how many idle sandboxes of a runtime fit in a memory
// budget on this host.
type DensityResult struct {
	Runtime     string `json:"runtime"`
	BudgetBytes int64  `json:"budget_bytes"`
	Created     int    `json:"created"` // idle sandboxes made (stops at the budget or the cap)
	// PSSBytes is the summed PSS of every created sandbox's host processes.
	PSSBytes int64 `json:"pss_bytes"`
	// HostBytes is how much MemAvailable fell while they were made (page
	// cache, kernel memory and the manager's own included).
	HostBytes int64 `json:"host_bytes"`
	// FitPSS and FitHost are the sandboxes the budget holds by each
	// measure, extrapolated when the cap stopped the run first.
	FitPSS  int    `json:"fit_pss"`
	FitHost int    `json:"fit_host"`
	Stopped string `json:"stopped"` // why creating stopped
}

// DensityResults is the density section.
type DensityResults []DensityResult

// Density creates idle sandboxes on t (which must run on this host: their
// memory is read from their cgroups) until their summed PSS passes budget,
// maxN are made, or a create fails; then kills them.
func Density(ctx context.Context, t Target, runtimes []string, budget int64, maxN int, progress io.Writer) (DensityResults, error) {
	var out DensityResults
	for _, rt := range runtimes {
		fmt.Fprintf(progress, "bench: %s: density in %s (at most %d sandboxes)\n", rt, mib(budget), maxN)
		r := DensityResult{Runtime: rt, BudgetBytes: budget, Stopped: "cap"}
		var ids []string
		mem0 := memAvailable()
		for len(ids) < maxN {
			id, err := t.Create(ctx, rt)
			if id != "" {
				ids = append(ids, id)
			}
			if err != nil {
				r.Stopped = "create failed: " + err.Error()
				break
			}
			if len(ids)%10 != 0 {
				continue
			}
			if r.PSSBytes = totalPSS(ids); r.PSSBytes > budget {
				r.Stopped = "budget"
				break
			}
		}
		time.Sleep(2 * time.Second) // let start-up garbage settle
		r.Created, r.PSSBytes, r.HostBytes = len(ids), totalPSS(ids), mem0-memAvailable()
		r.FitPSS, r.FitHost = fit(budget, r.PSSBytes, len(ids)), fit(budget, r.HostBytes, len(ids))
		for _, id := range ids {
			_ = t.Kill(context.WithoutCancel(ctx), id)
		}
		out = append(out, r)
		if ctx.Err() != nil {
			return out, ctx.Err()
		}
	}
	return out, nil
}

func totalPSS(ids []string) int64 {
	var sum int64
	for _, id := range ids {
		pss, _, _ := sandboxMemory(sandbox.ID(id))
		sum += pss
	}
	return sum
}

// fit is how many sandboxes of used/n bytes each fit in budget.
func fit(budget, used int64, n int) int {
	if n == 0 || used/int64(n) < 64<<10 { // nothing measurable
		return 0
	}
	return int(budget / (used / int64(n)))
}

// WriteMarkdown renders the density section.
func (rs DensityResults) WriteMarkdown(w io.Writer) {
	fmt.Fprintf(w, "\n## Density: idle sandboxes in a memory budget\n\n")
	fmt.Fprintf(w, "| runtime | budget | sandboxes made | summed PSS | per sandbox | fit by PSS | host MemAvailable drop | per sandbox | fit by host | stopped by |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rs {
		per := func(b int64) string {
			if r.Created == 0 {
				return "–"
			}
			return mib(b / int64(r.Created))
		}
		fit := func(n int) string {
			if n == 0 {
				return "–"
			}
			return fmt.Sprint(n)
		}
		fmt.Fprintf(w, "| %s | %s | %d | %s | %s | %s | %s | %s | %s | %s |\n", r.Runtime, mib(r.BudgetBytes), r.Created,
			mib(r.PSSBytes), per(r.PSSBytes), fit(r.FitPSS), mib(r.HostBytes), per(r.HostBytes), fit(r.FitHost), r.Stopped)
	}
	fmt.Fprintf(w, "\n*Fit* extrapolates from the sandboxes made when the cap stopped the run before the budget. PSS counts the sandboxes' host processes only; the host's MemAvailable drop also counts page cache for their layers and kernel memory (and anything else the machine did meanwhile).\n")
}
