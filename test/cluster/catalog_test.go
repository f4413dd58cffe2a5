package cluster_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/client"
	"github.com/kiln-sh/kiln/internal/cluster"
	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/store/postgres/pgtest"
)

// TestCatalogRestart is the PostgreSQL restart drill (docs/cluster.md):
// a front and two nodes on a catalog of the test's own, sandboxes, and
// creates in flight all along; the database is stopped at once (as pg_ctl
// stop -m immediate) for longer than nodes may go without a heartbeat.
// Meanwhile the front answers 503 "catalog unavailable", never 500, and no
// process dies. Once it is back, everything works again through the front
// without restarting anything; no node is marked lost; every create that
// reported success has its record and its container, on its node; creates
// that failed left neither (each node's sandbox dirs and runc containers
// match its records in the catalog).
func TestCatalogRestart(t *testing.T) {
	began := time.Now()
	pg := pgtest.Private(t) // before the world: its cleanup reads the catalog
	w := newWorldOn(t, pg.URL())
	front := w.firstFront("front-1")
	nodes := []*proc{w.start("node-a", config.RoleNode, ""), w.start("node-b", config.RoleNode, "")}
	for _, p := range nodes {
		w.ready(p)
	}
	w.waitLive("node-a", "node-b")
	f := client.New(front.URL, w.key)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	var old []string
	for range 4 {
		sb, err := f.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "base", Runtime: "runc", Timeout: 600})
		if err != nil {
			t.Fatal(err)
		}
		old = append(old, sb.ID)
	}
	t.Logf("cluster up with %d sandboxes at %v", len(old), time.Since(began).Round(time.Millisecond))

	// Creates in flight all along: 4 clients, one create after another.
	type outcome struct {
		id  string
		err error
	}
	var (
		mu       sync.Mutex
		outcomes []outcome
		wg       sync.WaitGroup
	)
	stopCreates := make(chan struct{})
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stopCreates:
					return
				default:
				}
				cctx, ccancel := context.WithTimeout(ctx, time.Minute)
				sb, err := f.CreateSandbox(cctx, api.CreateSandboxRequest{Template: "base", Runtime: "runc", Timeout: 600})
				ccancel()
				o := outcome{err: err}
				if err == nil {
					o.id = sb.ID
				}
				mu.Lock()
				outcomes = append(outcomes, o)
				mu.Unlock()
				time.Sleep(100 * time.Millisecond)
			}
		}()
	}
	defer func() {
		select {
		case <-stopCreates:
		default:
			close(stopCreates)
		}
		wg.Wait()
	}()
	time.Sleep(2 * time.Second)

	// The outage: longer than the silence after which a node is lost.
	outage := heartbeat*lostAfter + 2*time.Second
	pg.Stop(t)
	downAt := time.Now()
	seen := map[string]map[int]int{} // what → status → times
	see := func(what string, err error, mayWork bool) {
		status := http.StatusOK
		var ce *client.Error
		switch {
		case errors.As(err, &ce):
			status = ce.Status
			if status == http.StatusServiceUnavailable && !strings.Contains(ce.Message, "catalog unavailable") {
				t.Errorf("%s while the catalog is down: %q, want it to say the catalog is unavailable", what, ce.Message)
			}
		case err != nil:
			t.Errorf("%s while the catalog is down: %v", what, err)
			status = -1
		}
		if status != http.StatusServiceUnavailable && (!mayWork || status != http.StatusOK) {
			t.Errorf("%s while the catalog is down: status %d (%v), want 503", what, status, err)
		}
		if seen[what] == nil {
			seen[what] = map[int]int{}
		}
		seen[what][status]++
	}
	for time.Since(downAt) < outage {
		_, err := f.ListSandboxes(ctx, client.ListFilter{})
		see("a list", err, false)
		_, err = f.Nodes(ctx)
		see("GET /v1/nodes", err, false)
		_, err = f.GetSandbox(ctx, old[0])
		see("a get", err, false)
		_, err = f.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "base", Runtime: "runc"})
		see("a create", err, false)
		// E2B's API: the control plane, and the data plane (not its 502,
		// "the sandbox is gone": it may be fine).
		for what, hdr := range map[string][2]string{
			"an E2B get":        {"X-API-Key", w.key},
			"an E2B data-plane": {"E2b-Sandbox-Id", old[0]},
		} {
			path := "/sandboxes/" + old[0]
			if hdr[0] != "X-API-Key" {
				path = "/health"
			}
			req, _ := http.NewRequestWithContext(ctx, "GET", front.URL+path, nil)
			req.Header.Set(hdr[0], hdr[1])
			req.Header.Set("E2b-Sandbox-Port", "49983")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusServiceUnavailable {
				t.Errorf("%s while the catalog is down: status %d, want 503", what, resp.StatusCode)
			}
			if seen[what] == nil {
				seen[what] = map[int]int{}
			}
			seen[what][resp.StatusCode]++
		}
		// A command needs no catalog read on a front that routed the
		// sandbox before, nor on a node that knows the key: it may work.
		_, err = f.Output(ctx, old[1], api.CommandRequest{Cmd: "true"})
		see("a command", err, true)
		for _, p := range append([]*proc{front}, nodes...) {
			select {
			case <-p.Exited:
				logs, _ := os.ReadFile(p.Log)
				t.Fatalf("%s died while the catalog was down:\n%s", p.Name, logs)
			default:
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("answers while the catalog was down for %v (status: times): %v", time.Since(downAt).Round(time.Millisecond), seen)
	pg.Start(t)
	upAt := time.Now()
	for {
		_, err := f.ListSandboxes(ctx, client.ListFilter{})
		if err == nil {
			break
		}
		if time.Since(upAt) > 30*time.Second {
			t.Fatalf("a list through the front 30 s after the catalog restarted: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("the front lists again %v after the catalog restarted", time.Since(upAt).Round(time.Millisecond))
	time.Sleep(2 * time.Second) // creates after the outage too
	close(stopCreates)
	wg.Wait()

	// Everything works again through the front.
	for _, id := range old {
		out, err := f.Output(ctx, id, api.CommandRequest{Cmd: "echo back"})
		if err != nil || out.Stdout != "back\n" {
			t.Errorf("a command on %s (on %s) after the restart: %+v, %v", id, w.nodeOf(id), out, err)
		}
	}
	made := slices.Clone(old)
	for range 2 {
		sb, err := f.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "base", Runtime: "runc", Timeout: 600})
		if err != nil {
			t.Fatalf("a create after the restart: %v", err)
		}
		made = append(made, sb.ID)
	}
	var ok, failed int
	for _, o := range outcomes {
		if o.err == nil {
			ok++
			made = append(made, o.id)
			continue
		}
		failed++
		var ce *client.Error
		if !errors.As(o.err, &ce) || ce.Status != http.StatusServiceUnavailable {
			t.Errorf("a create in flight across the outage failed with %v, want 503", o.err)
		}
	}
	t.Logf("creates in flight across the outage: %d succeeded, %d failed", ok, failed)
	for _, p := range append([]*proc{front}, nodes...) {
		// Every process sweeps; each saw the outage and resumed.
		logs, _ := os.ReadFile(p.Log)
		if !strings.Contains(string(logs), "sweeping resumes") {
			t.Errorf("%s's log does not say its sweeps resumed after the outage", p.Name)
		}
		if p == front {
			continue
		}
		t.Logf("%s: %d creates unwound while their record could not be deleted, %d such records deleted once the catalog was back, heartbeats resumed %d times",
			p.Name, strings.Count(string(logs), "deleting the record of a failed create once it is back"),
			strings.Count(string(logs), "deleted the record of a failed create"), strings.Count(string(logs), "heartbeat written again"))
	}

	// No node was marked lost: watched until well past the silence after
	// the restart (sweepers excuse the outage, heartbeats resume at once).
	for time.Since(upAt) < heartbeat*lostAfter+3*time.Second {
		ns, err := f.Nodes(ctx)
		if err != nil {
			t.Fatalf("GET /v1/nodes after the restart: %v", err)
		}
		for _, n := range ns {
			if n.State != cluster.NodeLive {
				t.Fatalf("node %s is %s (%s) after the catalog restarted, want live", n.Name, n.State, n.Reason)
			}
		}
		time.Sleep(250 * time.Millisecond)
	}

	// Each node's sandboxes (dirs and runc containers) are its records
	// that have not ended: failed creates left nothing (their records are
	// deleted once the catalog is back), successful ones are all there.
	var mismatch string
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		mismatch = w.reconcile(ctx, nodes, made)
		if mismatch == "" || time.Now().After(deadline) {
			break
		}
	}
	if mismatch != "" {
		t.Error(mismatch)
	}
	if l, err := f.ListSandboxes(ctx, client.ListFilter{States: []string{"failed"}}); err != nil || len(l.Sandboxes) != 0 {
		t.Errorf("failed sandboxes after the drill: %+v, %v; want none (nothing lost)", l, err)
	}
	t.Logf("TestCatalogRestart took %v", time.Since(began).Round(time.Millisecond))
}

// reconcile compares each node's sandbox dirs and running runc containers
// with its records that have not ended, and those with made (the
// sandboxes that should run): "" when they all agree, else what differs.
func (w *world) reconcile(ctx context.Context, nodes []*proc, made []string) string {
	var diffs []string
	var active []string
	for _, p := range nodes {
		recs, _, err := w.catalog.ListSandboxes(ctx, sandbox.Filter{Node: p.Name, States: []sandbox.State{
			sandbox.StateCreating, sandbox.StateRunning, sandbox.StatePaused, sandbox.StateStopping}, Limit: 1000})
		if err != nil {
			return "listing the catalog: " + err.Error()
		}
		var ids []string
		for _, r := range recs {
			ids = append(ids, r.ID.String())
		}
		active = append(active, ids...)
		dirs, containers := w.sandboxesOn(p)
		slices.Sort(ids)
		if !slices.Equal(dirs, ids) || !slices.Equal(containers, ids) {
			diffs = append(diffs, p.Name+": records "+strings.Join(ids, ",")+"; dirs "+strings.Join(dirs, ",")+
				"; running containers "+strings.Join(containers, ","))
		}
	}
	slices.Sort(active)
	made = slices.Sorted(slices.Values(made))
	if !slices.Equal(active, made) {
		diffs = append(diffs, "records that have not ended: "+strings.Join(active, ",")+
			"; sandboxes whose create succeeded: "+strings.Join(made, ","))
	}
	return strings.Join(diffs, "\n")
}

// sandboxesOn lists, sorted, node p's sandbox dirs and the runc
// containers running from them.
func (w *world) sandboxesOn(p *proc) (dirs, running []string) {
	w.t.Helper()
	root := filepath.Join(dataDirOf(p), "sandboxes")
	entries, err := os.ReadDir(root)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		w.t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() {
			dirs = append(dirs, e.Name())
		}
	}
	out, err := exec.Command("runc", "--root", "/run/kiln/runc", "list", "--format", "json").Output()
	if err != nil {
		w.t.Fatalf("runc list: %v", err)
	}
	var list []struct {
		ID     string `json:"id"`
		Status string `json:"status"`
		Bundle string `json:"bundle"`
	}
	if err := json.Unmarshal(out, &list); err != nil {
		w.t.Fatalf("runc list: %v: %s", err, out)
	}
	for _, c := range list {
		if filepath.Dir(c.Bundle) == root && c.Status == "running" {
			running = append(running, c.ID)
		}
	}
	slices.Sort(dirs)
	slices.Sort(running)
	return dirs, running
}
