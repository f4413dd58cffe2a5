package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/client"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/apikey"
	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/server"
)

// LoadOptions control the API load run.
type LoadOptions struct {
	Runtime     string
	Sandboxes   int // created concurrently
	Commands    int // spread across the sandboxes
	Concurrency int // commands in flight
	Overhead    int // `true` round trips per path for the overhead comparison
	Config      config.Config
}

// LoadResult is the outcome of the API load run.
type LoadResult struct {
	Runtime      string        `json:"runtime"`
	Sandboxes    int           `json:"sandboxes"`
	Commands     int           `json:"commands"`
	CreateErrors int           `json:"create_errors"`
	CmdErrors    int           `json:"command_errors"`
	CreateWall   time.Duration `json:"create_wall_ns"` // all creates, concurrently
	Create       Dist          `json:"create"`         // per call, through the API
	Command      Dist          `json:"command"`
	Direct       Dist          `json:"true_direct"` // `true` via Agent.Exec vs via the API
	HTTP         Dist          `json:"true_api"`
	FirstError   string        `json:"first_error,omitempty"`
}

// Load drives a real kiln API server (in-process, on loopback) with the Go
// SDK: many concurrent creates, then many commands across the sandboxes,
// and compares a command's latency through the API with a direct call.
func Load(ctx context.Context, m *sandbox.Manager, keys apikey.Store, o LoadOptions, progress io.Writer) (*LoadResult, error) {
	k, secret := apikey.New("bench", false)
	k.MaxSandboxes = o.Sandboxes + 1
	if err := keys.CreateKey(ctx, k); err != nil {
		return nil, err
	}
	srv := server.New(server.Options{Manager: m, Keys: keys, Config: o.Config,
		Log: slog.New(slog.NewTextHandler(progress, &slog.HandlerOptions{Level: slog.LevelError}))})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	hs := &http.Server{Handler: srv}
	go hs.Serve(ln)
	defer hs.Close()
	c := client.New("http://"+ln.Addr().String(), secret)
	res := &LoadResult{Runtime: o.Runtime, Sandboxes: o.Sandboxes, Commands: o.Commands}
	var firstErr atomic.Value
	fail := func(err error) {
		firstErr.CompareAndSwap(nil, err.Error())
	}

	fmt.Fprintf(progress, "bench: load: %d concurrent creates (%s)\n", o.Sandboxes, o.Runtime)
	ids := make([]string, o.Sandboxes)
	creates := make([]time.Duration, o.Sandboxes)
	var errs atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for i := range o.Sandboxes {
		wg.Go(func() {
			t := time.Now()
			sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Runtime: o.Runtime, Timeout: 900})
			creates[i] = time.Since(t)
			if err != nil {
				errs.Add(1)
				fail(err)
				return
			}
			ids[i] = sb.ID
		})
	}
	wg.Wait()
	res.CreateWall, res.CreateErrors, res.Create = time.Since(start), int(errs.Load()), dist(creates)
	defer func() {
		for _, id := range ids {
			if id != "" {
				_ = c.KillSandbox(context.WithoutCancel(ctx), id)
			}
		}
	}()
	var live []string
	for _, id := range ids {
		if id != "" {
			live = append(live, id)
		}
	}
	if len(live) == 0 {
		return res, fmt.Errorf("no sandbox was created: %v", firstErr.Load())
	}

	fmt.Fprintf(progress, "bench: load: %d commands, %d in flight\n", o.Commands, o.Concurrency)
	errs.Store(0)
	lat := make([]time.Duration, o.Commands)
	next := atomic.Int64{}
	for range o.Concurrency {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= o.Commands {
					return
				}
				want := fmt.Sprintf("cmd %d\n", i)
				t := time.Now()
				r, err := c.Output(ctx, live[i%len(live)], api.CommandRequest{Args: []string{"echo", "cmd", fmt.Sprint(i)}})
				lat[i] = time.Since(t)
				if err == nil && (r.Exit.Code != 0 || r.Stdout != want) {
					err = fmt.Errorf("command %d: exit %d, output %q", i, r.Exit.Code, r.Stdout)
				}
				if err != nil {
					errs.Add(1)
					fail(err)
				}
			}
		})
	}
	wg.Wait()
	res.CmdErrors, res.Command = int(errs.Load()), dist(lat)

	fmt.Fprintf(progress, "bench: load: API overhead, %d round trips each\n", o.Overhead)
	id := live[0]
	agent, err := m.Agent(sandbox.ID(id))
	if err != nil {
		return res, err
	}
	var direct, viaHTTP []time.Duration
	for range o.Overhead {
		t := time.Now()
		if _, err := agent.Exec(ctx, wire.ExecParams{Args: []string{"true"}}, func(api.Event) error { return nil }); err != nil {
			return res, err
		}
		direct = append(direct, time.Since(t))
		t = time.Now()
		if _, err := c.Output(ctx, id, api.CommandRequest{Args: []string{"true"}}); err != nil {
			return res, err
		}
		viaHTTP = append(viaHTTP, time.Since(t))
	}
	res.Direct, res.HTTP = dist(direct), dist(viaHTTP)
	if v := firstErr.Load(); v != nil {
		res.FirstError = v.(string)
	}
	if res.CreateErrors+res.CmdErrors > 0 {
		return res, errors.New("load run had errors: " + res.FirstError)
	}
	return res, nil
}

// WriteMarkdown appends the load results to a report.
func (r *LoadResult) WriteMarkdown(w io.Writer) {
	fmt.Fprintf(w, "\n## API under load (%s)\n\n", r.Runtime)
	fmt.Fprintf(w, "A real `kiln serve` handler on loopback, driven by the Go SDK (`kiln bench --load`).\n\n")
	fmt.Fprintf(w, "| what | result |\n|---|---|\n")
	fmt.Fprintf(w, "| %d concurrent creates | %d errors, all done in %s; per create p50 %s, p99 %s |\n",
		r.Sandboxes, r.CreateErrors, r.CreateWall.Round(time.Millisecond), ms(r.Create.P50), ms(r.Create.P99))
	fmt.Fprintf(w, "| %d commands across them | %d errors; p50 %s, p99 %s |\n", r.Commands, r.CmdErrors, ms(r.Command.P50), ms(r.Command.P99))
	fmt.Fprintf(w, "| `true`, direct `Agent.Exec` | p50 %s, p99 %s |\n", ms(r.Direct.P50), ms(r.Direct.P99))
	fmt.Fprintf(w, "| `true`, through the API | p50 %s, p99 %s |\n", ms(r.HTTP.P50), ms(r.HTTP.P99))
	fmt.Fprintf(w, "| API overhead per command (p50 difference; target ≤ 2 ms) | %s |\n", ms(r.HTTP.P50-r.Direct.P50))
}
