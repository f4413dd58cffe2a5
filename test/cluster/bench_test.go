package cluster_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/client"
	"github.com/kiln-sh/kiln/internal/cluster"
	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/e2b"
	"github.com/kiln-sh/kiln/internal/servetest"
	"github.com/kiln-sh/kiln/internal/store/postgres/pgtest"
)

// BenchmarkCluster measures a cluster of real processes against one
// all-in-one kiln serve on the same machine (docs/benchmarks.md,
// "Cluster"): 2 fronts and 3 nodes on a PostgreSQL catalog, and two
// all-in-one servers, one on SQLite (the one-machine default) and one on
// its own PostgreSQL database. Run as root:
//
//	go test -run '^$' -bench Cluster -benchtime 3x -timeout 60m ./test/cluster/
//
// Sub-benchmarks:
//   - create/RUNTIME/N: per iteration, a round on each target in turn
//     (cluster, all-sqlite, all-postgres; the first rotating): N creates of
//     base started together (through both fronts alternately, for the
//     cluster), each timed to its answer, then all killed. Reported per
//     target over its rounds: creates/s (creates over the rounds' wall
//     time), p50 and p99; and each round's rate with the load average.
//   - proxy/command, proxy/code, proxy/e2b-run_code: one sandbox on a node,
//     the same call sent straight to the node (with the cluster token, as a
//     front sends it) and through a front, interleaved; the medians and
//     their difference (the front's added round trip).
//
// KILN_BENCH_RUNTIMES (default "runc") lists the runtimes of the create
// rounds, e.g. "runc,runsc", and KILN_BENCH_CREATES (default "50,200")
// their sizes; -bench 'Cluster/proxy' runs the round trips alone. Nothing here asserts a time: the machine is
// shared; load averages are logged with every result.
func BenchmarkCluster(b *testing.B) {
	began := time.Now()
	w := newWorld(b)
	// 200 creates at once need the key's quota (count and memory) above
	// them on every process: fronts check it across the cluster, nodes and
	// all-in-one servers per process.
	quota := []string{"KILN_MAX_SANDBOXES=1000", "KILN_MAX_MEMORY=1024G"}
	front1 := w.firstFront("front-1", quota...)
	front2 := w.start("front-2", config.RoleFront, "", quota...)
	nodes := []*proc{w.start("node-a", config.RoleNode, "", quota...),
		w.start("node-b", config.RoleNode, "", quota...), w.start("node-c", config.RoleNode, "", quota...)}
	allSQLite := w.start("all-sqlite", config.RoleAll, "", append(quota, "KILN_STORE=sqlite")...)
	allPG := w.start("all-postgres", config.RoleAll, "", append(quota, "KILN_STORE="+pgtest.URL(b))...)
	for _, p := range append([]*proc{front2, allSQLite, allPG}, nodes...) {
		w.ready(p)
	}
	w.waitLive("node-a", "node-b", "node-c")
	b.Logf("cluster and all-in-one servers up in %v; load average %s", time.Since(began).Round(time.Millisecond), loadavg())

	ctx := context.Background()
	fronts := []*client.Client{client.New(front1.URL, w.key), client.New(front2.URL, w.key)}
	alone := map[string][]*client.Client{}
	for _, p := range []*proc{allSQLite, allPG} {
		select {
		case k := <-p.Key:
			c := client.New(p.URL, k)
			alone[p.Name] = []*client.Client{c}
			// An all-in-one server's sandboxes are not in the catalog:
			// kill what a failed round left before the world stops it.
			b.Cleanup(func() { killAll(b, c) })
		case <-time.After(10 * time.Second):
			b.Fatalf("%s printed no admin key", p.Name)
		}
	}
	targets := []struct {
		name    string
		clients []*client.Client
	}{
		{"cluster", fronts}, {"all-sqlite", alone["all-sqlite"]}, {"all-postgres", alone["all-postgres"]},
	}
	runtimes := strings.Split(cmp.Or(os.Getenv("KILN_BENCH_RUNTIMES"), "runc"), ",")
	var sizes []int
	for f := range strings.SplitSeq(cmp.Or(os.Getenv("KILN_BENCH_CREATES"), "50,200"), ",") {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 || n > 1000 {
			b.Fatalf("KILN_BENCH_CREATES: %q is not a number of creates (1-1000)", f)
		}
		sizes = append(sizes, n)
	}
	for _, rt := range runtimes {
		for _, n := range sizes {
			// One round on each target per iteration, in turn, the
			// first target rotating: the host's load drifts, and
			// interleaved rounds see the same drift.
			b.Run(fmt.Sprintf("create/%s/%d", rt, n), func(b *testing.B) {
				type result struct {
					lat    []time.Duration
					wall   time.Duration
					errs   int
					rounds []string // each round's rate and load
				}
				res := make([]result, len(targets))
				for i := range b.N {
					for j := range targets {
						t := (i + j) % len(targets)
						lat, took, failed := createRound(ctx, b, targets[t].clients, rt, n)
						r := &res[t]
						r.lat, r.wall, r.errs = append(r.lat, lat...), r.wall+took, r.errs+failed
						r.rounds = append(r.rounds, fmt.Sprintf("%.1f/s at %s", float64(len(lat))/took.Seconds(), loadavg()))
						if failed > 0 {
							w.logErrors(b, 5)
						}
					}
				}
				for t, r := range res {
					slices.Sort(r.lat)
					rate := float64(len(r.lat)) / r.wall.Seconds()
					name := targets[t].name
					b.ReportMetric(rate, name+"-creates/s")
					b.ReportMetric(ms(pct(r.lat, 50)), name+"-p50-ms")
					b.ReportMetric(ms(pct(r.lat, 99)), name+"-p99-ms")
					b.Logf("| %s | %s | %d | %d | %.1f/s | %.0f ms | %.0f ms | %d | %s |", name, rt, n, len(r.lat), rate,
						ms(pct(r.lat, 50)), ms(pct(r.lat, 99)), r.errs, strings.Join(r.rounds, "; "))
				}
			})
		}
	}

	direct := func(p *proc) *client.Client {
		return client.New(p.URL, w.key, client.WithHTTPClient(&http.Client{Transport: tokenTransport{w.token}}))
	}
	// nodeClient is a client straight to the node that runs id.
	nodeClient := func(id string) *client.Client {
		name := w.nodeOf(id)
		for _, p := range nodes {
			if p.Name == name {
				return direct(p)
			}
		}
		b.Fatalf("sandbox %s is on %q, not a node of this cluster", id, name)
		return nil
	}

	// proxied times call (the same request) straight to the node of a
	// new sandbox of template and through a front.
	proxied := func(template, what string, samples int, call func(c *client.Client, id string) error) func(b *testing.B) {
		return func(b *testing.B) {
			sb, err := fronts[0].CreateSandbox(ctx, api.CreateSandboxRequest{Template: template, Runtime: "runc", Timeout: 600})
			if err != nil {
				b.Fatal(err)
			}
			defer fronts[0].KillSandbox(ctx, sb.ID)
			node := nodeClient(sb.ID)
			interleave(b, what, samples, func() error { return call(node, sb.ID) }, func() error { return call(fronts[0], sb.ID) })
		}
	}
	b.Run("proxy/command", proxied("base", "`true` command", 200, func(c *client.Client, id string) error {
		_, err := c.Output(ctx, id, api.CommandRequest{Args: []string{"true"}})
		return err
	}))
	b.Run("proxy/code", proxied("code-interpreter", "native code `1+1` (python)", 100, func(c *client.Client, id string) error {
		res, err := c.RunCode(ctx, id, api.CodeRequest{Code: "1+1"}, client.CodeOptions{})
		if err == nil && (len(res.Results) == 0 || res.Results[0].Data["text/plain"] != "2") {
			err = fmt.Errorf("1+1 gave %+v", res)
		}
		return err
	}))

	b.Run("proxy/e2b-run_code", func(b *testing.B) {
		sb := e2bCreate(ctx, b, front1.URL, w.key, "code-interpreter")
		defer fronts[0].KillSandbox(ctx, sb.SandboxID)
		var node *proc
		for _, p := range nodes {
			if p.Name == w.nodeOf(sb.SandboxID) {
				node = p
			}
		}
		call := func(base, token string) func() error {
			return func() error { return e2bExecute(ctx, base, token, sb, "1+1") }
		}
		interleave(b, "E2B run_code `1+1` (/execute, by E2b-Sandbox-Id)", 100, call(node.URL, w.token), call(front1.URL, ""))
	})
	b.Logf("BenchmarkCluster took %v", time.Since(began).Round(time.Millisecond))
}

// createRound starts n creates of base at once through clients (in turn)
// and returns each successful create's time, the round's wall time and
// the number of failures; it kills every sandbox it made before
// returning.
func createRound(ctx context.Context, b *testing.B, clients []*client.Client, runtime string, n int) ([]time.Duration, time.Duration, int) {
	b.Helper()
	lat := make([]time.Duration, n)
	ids := make([]string, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			began := time.Now()
			sb, err := clients[i%len(clients)].CreateSandbox(ctx, api.CreateSandboxRequest{Template: "base", Runtime: runtime, Timeout: 900})
			lat[i], errs[i] = time.Since(began), err
			if err == nil {
				ids[i] = sb.ID
			}
		}()
	}
	began := time.Now()
	close(start)
	wg.Wait()
	wall := time.Since(began)
	var ok []time.Duration
	failed := 0
	for i, err := range errs {
		if err != nil {
			failed++
			if failed <= 3 {
				b.Logf("create %d: %v", i, err)
			}
			continue
		}
		ok = append(ok, lat[i])
	}
	// Kill them, 16 at a time, outside the timing.
	sem := make(chan struct{}, 16)
	for i, id := range ids {
		if id == "" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			if err := clients[i%len(clients)].KillSandbox(ctx, id); err != nil {
				b.Errorf("killing %s: %v", id, err)
			}
		}()
	}
	wg.Wait()
	return ok, wall, failed
}

// interleave times samples pairs of direct() and front() calls, one after
// the other (the first pairs warm both paths' connections and the
// sandbox's interpreter), and reports the medians and their difference.
func interleave(b *testing.B, what string, samples int, direct, front func() error) {
	b.Helper()
	const warm = 5
	var ds, fs []time.Duration
	for range b.N {
		for i := range samples + warm {
			d, err := timed(direct)
			if err != nil {
				b.Fatalf("%s straight to the node: %v", what, err)
			}
			f, err := timed(front)
			if err != nil {
				b.Fatalf("%s through a front: %v", what, err)
			}
			if i >= warm {
				ds, fs = append(ds, d), append(fs, f)
			}
		}
	}
	slices.Sort(ds)
	slices.Sort(fs)
	added := pct(fs, 50) - pct(ds, 50)
	b.ReportMetric(ms(pct(ds, 50)), "direct-p50-ms")
	b.ReportMetric(ms(pct(fs, 50)), "front-p50-ms")
	b.ReportMetric(ms(added), "added-ms")
	b.Logf("| %s | %d | %.2f ms | %.2f ms | %.2f ms | %.2f ms | %.2f ms | %s |", what, len(ds), ms(pct(ds, 50)), ms(pct(ds, 99)),
		ms(pct(fs, 50)), ms(pct(fs, 99)), ms(added), loadavg())
}

func timed(f func() error) (time.Duration, error) {
	began := time.Now()
	err := f()
	return time.Since(began), err
}

// e2bCreate makes a sandbox of template through E2B's create route at
// base.
func e2bCreate(ctx context.Context, b *testing.B, base, key, template string) e2bSandbox {
	b.Helper()
	req, _ := http.NewRequestWithContext(ctx, "POST", base+"/sandboxes",
		strings.NewReader(`{"templateID":"`+template+`","timeout":600}`))
	req.Header.Set("X-API-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var sb e2bSandbox
	if resp.StatusCode != http.StatusCreated || json.Unmarshal(body, &sb) != nil || sb.SandboxID == "" {
		b.Fatalf("E2B create of %s: %d %s", template, resp.StatusCode, body)
	}
	return sb
}

// e2bExecute is what E2B's SDKs' run_code sends: code to the code
// interpreter's /execute (port 49999), routed by the E2b-Sandbox-Id
// header, whose answer is an NDJSON stream read to its end. A token is
// the cluster token, for a node.
func e2bExecute(ctx context.Context, base, token string, sb e2bSandbox, code string) error {
	body, _ := json.Marshal(map[string]string{"code": code})
	req, _ := http.NewRequestWithContext(ctx, "POST", base+"/execute", bytes.NewReader(body))
	req.Header.Set("E2b-Sandbox-Id", sb.SandboxID)
	req.Header.Set("E2b-Sandbox-Port", fmt.Sprint(e2b.JupyterPort))
	req.Header.Set("X-Access-Token", sb.EnvdAccessToken)
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set(cluster.TokenHeader, token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("/execute: %d %v, after %q: %w", resp.StatusCode, resp.Header, out, err)
	}
	if resp.StatusCode != http.StatusOK || !bytes.Contains(out, []byte(`"text":"2"`)) {
		return fmt.Errorf("/execute: %d %.300s", resp.StatusCode, out)
	}
	return nil
}

// killAll kills every sandbox c's server lists.
func killAll(b *testing.B, c *client.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l, err := c.ListSandboxes(ctx, client.ListFilter{})
	if err != nil {
		b.Errorf("listing what is left: %v", err)
		return
	}
	var errs []error
	for _, sb := range l.Sandboxes {
		if sb.State == "running" || sb.State == "paused" || sb.State == "creating" {
			errs = append(errs, c.KillSandbox(ctx, sb.ID))
		}
	}
	if err := errors.Join(errs...); err != nil {
		b.Errorf("killing what is left: %v", err)
	}
}

// pct is the p-th percentile of sorted ds (nearest rank); 0 for none.
func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	i := (len(ds)*p + 99) / 100
	return ds[max(i-1, 0)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// loadavg is the host's 1, 5 and 15-minute load averages.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}

// logErrors logs to t up to n error lines of each process's log.
func (w *world) logErrors(t testing.TB, n int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, p := range w.procs {
		logs, _ := os.ReadFile(p.Log)
		var lines []string
		for l := range strings.Lines(servetest.GrepErrors(logs)) {
			if strings.Contains(l, `"level":"ERROR"`) && len(lines) < n {
				lines = append(lines, l)
			}
		}
		if len(lines) > 0 {
			t.Logf("%s: errors:\n%s", p.Name, strings.Join(lines, ""))
		}
	}
}
