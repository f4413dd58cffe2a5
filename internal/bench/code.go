package bench

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// CodeResult is one runtime's code-interpreter numbers.
type CodeResult struct {
	Runtime     string        `json:"runtime"`
	FirstResult time.Duration `json:"first_result_ns"` // create a code-interpreter sandbox → first `1+1` result
	Import      time.Duration `json:"import_ns"`       // `import pandas, matplotlib.pyplot` in a fresh context
	OnePlusOne  Dist          `json:"one_plus_one"`    // `1+1` in a warm context
}

// CodeResults is the code-interpreter section.
type CodeResults []CodeResult

// Code measures the code interpreter on each runtime: a cold first result
// (sandbox create plus kernel start), the cost of the data-science imports,
// and the warm `1+1` round trip.
func Code(ctx context.Context, m *sandbox.Manager, runtimes []string, n int, progress io.Writer) (CodeResults, error) {
	var out CodeResults
	for _, rt := range runtimes {
		fmt.Fprintf(progress, "bench: code interpreter on %s\n", rt)
		r := CodeResult{Runtime: rt}
		start := time.Now()
		sb, err := m.Create(ctx, sandbox.CreateOptions{Template: "code-interpreter", Runtime: rt, Cold: true})
		if err != nil {
			return nil, err
		}
		defer m.Kill(context.WithoutCancel(ctx), sb.ID)
		a, err := m.Agent(sb.ID)
		if err != nil {
			return nil, err
		}
		run := func(code string) error {
			var failed *api.ExecutionError
			_, err := a.Execute(ctx, wire.ExecuteParams{Language: "python", Code: code, TimeoutMs: 120_000}, func(ev api.Event) error {
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
		if err := run("1+1"); err != nil {
			return nil, err
		}
		r.FirstResult = time.Since(start)
		start = time.Now()
		if err := run("import pandas, matplotlib.pyplot"); err != nil {
			return nil, err
		}
		r.Import = time.Since(start)
		var s []time.Duration
		for range n {
			start = time.Now()
			if err := run("1+1"); err != nil {
				return nil, err
			}
			s = append(s, time.Since(start))
		}
		r.OnePlusOne = dist(s)
		out = append(out, r)
	}
	return out, nil
}

// WriteMarkdown renders the code-interpreter results.
func (rs CodeResults) WriteMarkdown(w io.Writer) {
	fmt.Fprintf(w, "\n## Code interpreter (Python, `code-interpreter` template)\n\n")
	fmt.Fprintf(w, "| runtime | create → first `1+1` result (cold kernel) | `import pandas, matplotlib.pyplot` | warm `1+1` p50 | p99 | target p50 |\n|---|---|---|---|---|---|\n")
	for _, r := range rs {
		target := ""
		if r.Runtime == "runsc" {
			target = "≤ 10.0 ms"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", r.Runtime, ms(r.FirstResult), ms(r.Import), ms(r.OnePlusOne.P50), ms(r.OnePlusOne.P99), target)
	}
	fmt.Fprintf(w, "\nCold starts pay for starting ipykernel (and the imports) in the sandbox; warm templates and pools (snapshots issue) are meant to remove that.\n")
}
