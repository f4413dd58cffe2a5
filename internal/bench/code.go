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
	// OnePlusOneStock is `1+1` in a second warm context whose kernel got
	// ipykernel's own stream flushing and IOPub messages back (Kiln's
	// kernel startup changes both): the same run's before.
	// OnePlusOnePaired is `1+1` in the first context again, alternating
	// with the stock one (both kernels running, as for the stock one).
	OnePlusOneStock  Dist `json:"one_plus_one_stock"`
	OnePlusOnePaired Dist `json:"one_plus_one_paired"`
	// Split is where the first context's warm `1+1`s spent their time.
	Split Split `json:"one_plus_one_split"`
}

// Split divides a warm `1+1` by the agent's event times (its clock is the
// host's under both runtimes): the call until the agent sends the result
// (host → agent, the kernel's run up to its execute_result), the result
// event's trip to the host, the agent's wait after the result (the
// kernel's reply and status idle), and the done event's trip back.
type Split struct {
	ToResult     Dist `json:"to_result"`
	ResultToHost Dist `json:"result_to_host"`
	ResultToDone Dist `json:"result_to_done"`
	DoneToReturn Dist `json:"done_to_return"`
}

// split collects the samples of a Split.
type split struct{ toResult, resultToHost, resultToDone, doneToReturn []time.Duration }

// add records one execution: started when it was called, the result and
// done events' times (the agent's clock), the result's arrival on the host
// and the call's return.
func (s *split) add(started, result, arrived, done, returned time.Time) {
	s.toResult = append(s.toResult, result.Sub(started))
	s.resultToHost = append(s.resultToHost, arrived.Sub(result))
	s.resultToDone = append(s.resultToDone, done.Sub(result))
	s.doneToReturn = append(s.doneToReturn, returned.Sub(done))
}

func (s *split) dist() Split {
	return Split{dist(s.toResult), dist(s.resultToHost), dist(s.resultToDone), dist(s.doneToReturn)}
}

// stockKernel undoes what the agent's Python kernel startup changes in
// ipykernel's messaging (OutStream flushing, the status busy and
// execute_input broadcasts, IOPub sends from the main thread, the sleep
// before each reply, the reply carried in the status idle), in the kernel
// it runs in.
const stockKernel = `def _kiln_stock():
    from IPython import get_ipython
    from ipykernel.iostream import OutStream
    stock = OutStream.__dict__.get("_kiln_stock")
    if stock is None:
        raise RuntimeError("the kernel has no Kiln messaging changes to undo")
    OutStream.write, OutStream._flush, OutStream.flush = stock
    del OutStream._kiln_gen
    kernel = get_ipython().kernel
    kernel.__dict__.pop("_publish_status", None)
    kernel.__dict__.pop("_publish_execute_input", None)
    kernel.iopub_thread.__dict__.pop("schedule", None)
    kernel.iopub_thread.__dict__.pop("send_multipart", None)
    kernel._execute_sleep = 0.0005
    kernel.session.__dict__.pop("send", None)
_kiln_stock()
del _kiln_stock`

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
		contextID := ""
		var sp *split // where run records the split, when set
		run := func(code string) error {
			var failed *api.ExecutionError
			var result, arrived, done time.Time
			started := time.Now()
			_, err := a.Execute(ctx, wire.ExecuteParams{ContextID: contextID, Language: "python", Code: code, TimeoutMs: 120_000}, func(ev api.Event) error {
				switch {
				case ev.ExecutionError != nil:
					failed = ev.ExecutionError
				case ev.Type == api.EventResult:
					result, arrived = ev.Time, time.Now()
				case ev.Type == api.EventDone:
					done = ev.Time
				}
				return nil
			})
			if sp != nil && !result.IsZero() && !done.IsZero() {
				sp.add(started, result, arrived, done, time.Now())
			}
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
		// onePlusOne times `1+1` n times in each of the contexts, in
		// turn.
		onePlusOne := func(contexts ...string) ([]Dist, error) {
			s := make([][]time.Duration, len(contexts))
			for range n {
				for i, c := range contexts {
					contextID = c
					start := time.Now()
					if err := run("1+1"); err != nil {
						return nil, err
					}
					s[i] = append(s[i], time.Since(start))
				}
			}
			ds := make([]Dist, len(s))
			for i := range s {
				ds[i] = dist(s[i])
			}
			return ds, nil
		}
		sp = &split{}
		ds, err := onePlusOne("")
		if err != nil {
			return nil, err
		}
		r.OnePlusOne, r.Split, sp = ds[0], sp.dist(), nil
		c, err := a.CreateContext(ctx, wire.ContextParams{Language: "python"})
		if err != nil {
			return nil, err
		}
		contextID = c.ID
		for _, code := range []string{stockKernel, "import pandas, matplotlib.pyplot"} {
			if err := run(code); err != nil {
				return nil, fmt.Errorf("stock kernel: %w", err)
			}
		}
		// Both kernels alive, executions alternating: the fair pair.
		if ds, err = onePlusOne("", c.ID); err != nil {
			return nil, err
		}
		r.OnePlusOnePaired, r.OnePlusOneStock = ds[0], ds[1]
		out = append(out, r)
	}
	return out, nil
}

// WriteMarkdown renders the code-interpreter results.
func (rs CodeResults) WriteMarkdown(w io.Writer) {
	fmt.Fprintf(w, "\n## Code interpreter (Python, `code-interpreter` template)\n\n")
	fmt.Fprintf(w, "| runtime | create → first `1+1` result (cold kernel) | `import pandas, matplotlib.pyplot` | warm `1+1` p50 | p99 | target p50 | alternating, Kiln's kernel: warm `1+1` p50 | p99 | alternating, stock ipykernel messaging: p50 | p99 |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rs {
		target := ""
		if r.Runtime == "runsc" {
			target = "≤ 10.0 ms"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.Runtime, ms(r.FirstResult), ms(r.Import), ms(r.OnePlusOne.P50), ms(r.OnePlusOne.P99), target,
			ms(r.OnePlusOnePaired.P50), ms(r.OnePlusOnePaired.P99), ms(r.OnePlusOneStock.P50), ms(r.OnePlusOneStock.P99))
	}
	for _, r := range rs {
		s := r.Split
		fmt.Fprintf(w, "\nWhere a warm `1+1` goes on %s (p50, by the agent's event times): call → the agent sends the result %s (host → agent, the kernel up to its execute_result), "+
			"the result event → host %s, the agent's wait for the kernel's reply and idle %s, done event → the call returns %s.\n",
			r.Runtime, ms(s.ToResult.P50), ms(s.ResultToHost.P50), ms(s.ResultToDone.P50), ms(s.DoneToReturn.P50))
	}
	fmt.Fprintf(w, "\nCold starts pay for starting ipykernel (and the imports) in the sandbox; warm templates and pools (snapshots issue) are meant to remove that.\n")
	fmt.Fprintf(w, "*Alternating*: `1+1` in the first context and in a second one of the same sandbox whose kernel had Kiln's messaging changes undone (stock ipykernel messaging), in turn, both kernels running; "+
		"the stock one is this run's before. Kiln's kernel startup "+
		"makes a flush of stdout/stderr with nothing unsent free, drops the status busy and execute_input messages the agent ignores, "+
		"sends IOPub messages from the main thread when nothing is queued for ipykernel's IOPub thread, skips ipykernel's 0.5 ms sleep before each reply "+
		"and puts what the agent reads of the reply in the status idle (the agent ends on it): "+
		"27 wake-ups of the IOPub thread around a `1+1` become none.\n")
}
