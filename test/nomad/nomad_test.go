// Package nomad_test deploys Kiln with the job files in deploy/nomad onto
// a real Nomad cluster on this machine (3 servers and 2 clients on
// 127.0.0.1, raw_exec) around a real PostgreSQL catalog: kiln nodes as
// the system job (one per client), a front as the service job; then
// create → command → code → kill through the front, and a Nomad client
// killed with -9 (its kiln node too) whose sandboxes Kiln reports lost
// while new ones go to the other node (deploy/nomad/README.md).
//
// Nomad is built from the Go module proxy by scripts/install-nomad.sh,
// which this test calls itself (a no-op once built), so a cold CI machine
// builds it while the other test packages run.
package nomad_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/client"
	"github.com/kiln-sh/kiln/internal/apikey"
	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/oci/ocitest"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/servetest"
	"github.com/kiln-sh/kiln/internal/store/postgres"
	"github.com/kiln-sh/kiln/internal/store/postgres/pgtest"
	"github.com/kiln-sh/kiln/internal/template"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// The test cluster's heartbeat: a node silent for 8 × 1 s is lost
// (test/cluster's: two test packages at once on CI's 2 cores must not
// starve a live node into looking lost).
const (
	heartbeat = time.Second
	lostAfter = 8
)

func TestNomad(t *testing.T) {
	began := time.Now()
	ocitest.RequireRoot(t)
	_, err := template.Lookup(config.FromEnv().DataDir, "base")
	ocitest.Require(t, err == nil, fmt.Sprintf("base template not built (make setup): %v", err))
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("scripts/install-nomad.sh took %v", installNomad(t, repo).Round(time.Millisecond))
	installed := time.Now()
	setup := time.Now()
	kiln := servetest.Build(t)
	t.Logf("built kiln in %v", time.Since(setup).Round(time.Millisecond))

	// The catalog, with the admin key made up front (the operator's way
	// to have one without reading a node's log).
	pg := pgtest.URL(t)
	catalog, err := postgres.Open(t.Context(), pg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { catalog.Close() })
	k, key := apikey.New("admin", true)
	if err := catalog.CreateKey(t.Context(), k); err != nil {
		t.Fatal(err)
	}
	tok := make([]byte, 24)
	_, _ = rand.Read(tok)
	token := hex.EncodeToString(tok)

	// One root for Nomad's and Kiln's dirs; each node's data dir shares
	// the machine's built templates.
	root, err := os.MkdirTemp("", "kiln-nomad-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // last: after the agents and sandboxes are gone
		unmountBelow(t, root)
		_ = os.RemoveAll(root)
	})
	nodeDir := func(name string) string { return filepath.Join(root, "node", name) }
	for _, n := range []string{"client-1", "client-2"} {
		if err := os.MkdirAll(filepath.Join(nodeDir(n), "data"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join(config.FromEnv().DataDir, "templates"), filepath.Join(nodeDir(n), "data", "templates")); err != nil {
			t.Fatal(err)
		}
	}

	setup = time.Now()
	nc := startNomad(t, root)
	t.Logf("Nomad up (3 servers, 2 clients) in %v", time.Since(setup).Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	var fc *client.Client
	var made []string
	t.Cleanup(func() {
		teardown(t, nc, kiln, root, fc, made)
		t.Logf("wall time %v, %v of it after Nomad's install", time.Since(began).Round(time.Millisecond),
			time.Since(installed).Round(time.Millisecond))
	})

	// Deploy: the nodes (system job), then the front (service job).
	setup = time.Now()
	common := []string{"-var", "kiln=" + kiln, "-var", "store=" + pg, "-var", "cluster_token=" + token,
		"-var", "heartbeat_interval=" + heartbeat.String(), "-var", fmt.Sprintf("node_lost_after=%d", lostAfter)}
	args := append([]string{"job", "run", "-detach"}, common...)
	args = append(args, "-var", "data_dir="+filepath.Join(root, "node", "${node.unique.name}", "data"),
		"-var", "run_dir="+filepath.Join(root, "node", "${node.unique.name}", "run"),
		"-var", "runtime=runc", "-var", "network=off", filepath.Join(repo, "deploy", "nomad", "kiln-node.nomad.hcl"))
	if _, err := nc.nomad(ctx, args...); err != nil {
		t.Fatal(err)
	}
	args = append([]string{"job", "run", "-detach"}, common...)
	args = append(args, "-var", "count=1", "-var", "port=0", "-var", "data_dir="+filepath.Join(root, "front"),
		filepath.Join(repo, "deploy", "nomad", "kiln-front.nomad.hcl"))
	if _, err := nc.nomad(ctx, args...); err != nil {
		t.Fatal(err)
	}
	servetest.WaitNodesLive(t, catalog, 90*time.Second, "client-1", "client-2")
	frontURL, frontClient := waitFront(t, nc, token)
	t.Logf("Kiln deployed (2 nodes, 1 front on %s) in %v", frontClient, time.Since(setup).Round(time.Millisecond))
	fc = client.New(frontURL, key)

	create := func() string {
		t.Helper()
		sb, err := fc.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "base", Runtime: "runc", Timeout: 300})
		if err != nil {
			t.Fatalf("creating a sandbox through the front: %v", err)
		}
		made = append(made, sb.ID)
		return sb.ID
	}
	nodeOf := func(id string) string {
		t.Helper()
		sb, err := catalog.GetSandbox(ctx, sandbox.ID(id))
		if err != nil {
			t.Fatalf("catalog record of %s: %v", id, err)
		}
		return sb.Node
	}
	command := func(id string) error {
		out, err := fc.Output(ctx, id, api.CommandRequest{Cmd: "echo hello-$KILN_SANDBOX_ID"})
		if err != nil {
			return fmt.Errorf("command: %w", err)
		}
		if strings.TrimSpace(out.Stdout) != "hello-"+id {
			return fmt.Errorf("command said %q, want hello-%s", out.Stdout, id)
		}
		return nil
	}

	t.Run("the front lists both nodes at their Nomad ports", func(t *testing.T) {
		ns, err := fc.Nodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, n := range ns {
			got[n.Name] = n.State
			// Advertised as http://${NOMAD_ADDR_http}: the client's range.
			if !strings.HasPrefix(n.URL, "http://127.0.0.1:2") || !slices.Contains(n.Runtimes, "runc") {
				t.Errorf("node %s: URL %s, runtimes %v; want a Nomad dynamic port on loopback, runc", n.Name, n.URL, n.Runtimes)
			}
		}
		if got["client-1"] != "live" || got["client-2"] != "live" {
			t.Errorf("nodes through the front: %v, want client-1 and client-2 live", got)
		}
	})

	t.Run("create, command, code and kill through the front", func(t *testing.T) {
		start := time.Now()
		id := create()
		if err := command(id); err != nil {
			t.Fatalf("sandbox %s on %s: %v", id, nodeOf(id), err)
		}
		res, err := fc.RunCode(ctx, id, api.CodeRequest{Language: "bash", Code: "echo $((6 * 7))"}, client.CodeOptions{})
		if err != nil || strings.TrimSpace(res.Stdout) != "42" || res.Error != nil {
			t.Fatalf("code cell in %s: %+v, %v; want 42", id, res, err)
		}
		if err := fc.KillSandbox(ctx, id); err != nil {
			t.Fatalf("killing %s: %v", id, err)
		}
		if sb, err := fc.GetSandbox(ctx, id); !client.IsCode(err, api.CodeNotFound) && (err != nil || sb.State != "stopped") {
			t.Errorf("killed sandbox %s: %+v, %v; want it stopped or gone", id, sb, err)
		}
		t.Logf("create → command → code → kill in %v", time.Since(start).Round(time.Millisecond))
	})

	// Sandboxes on both nodes; then the client that does not run the
	// front dies with its kiln node.
	on := map[string][]string{}
	for len(on["client-1"]) == 0 || len(on["client-2"]) == 0 {
		if len(made) > 8 {
			t.Fatalf("8 creates and not both nodes used: %v", on)
		}
		id := create()
		on[nodeOf(id)] = append(on[nodeOf(id)], id)
	}
	victim, survivor := "client-1", "client-2"
	if frontClient == victim {
		victim, survivor = survivor, victim
	}
	var va *agent
	for _, a := range nc.clients {
		if a.name == victim {
			va = a
		}
	}
	killedAt := time.Now()
	nc.kill9(va)
	pids := procs(kiln, "serve", "KILN_NODE_NAME="+victim)
	if len(pids) != 1 {
		t.Fatalf("kiln node processes of %s: %v, want one", victim, pids)
	}
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}

	t.Run("a killed client's sandboxes are reported lost", func(t *testing.T) {
		deadline := killedAt.Add(heartbeat*lostAfter + 20*time.Second)
		for _, id := range on[victim] {
			for {
				sb, err := fc.GetSandbox(ctx, id)
				if err == nil && sb.State == "failed" {
					if !strings.Contains(sb.Reason, "node "+victim+" lost") {
						t.Errorf("lost sandbox %s has reason %q, want one naming node %s", id, sb.Reason, victim)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("sandbox %s of killed node %s: %+v, %v; want failed (lost) by now", id, victim, sb, err)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
		t.Logf("lost reported %v after the kill", time.Since(killedAt).Round(time.Millisecond))
		ns, err := fc.Nodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range ns {
			if want := map[string]string{victim: "lost", survivor: "live"}[n.Name]; n.State != want {
				t.Errorf("node %s through the front: %s (%s), want %s", n.Name, n.State, n.Reason, want)
			}
		}
		if err := command(on[survivor][0]); err != nil {
			t.Errorf("sandbox %s on surviving %s: %v", on[survivor][0], survivor, err)
		}
	})

	t.Run("new creates go to the other node", func(t *testing.T) {
		for range 2 {
			id := create()
			if n := nodeOf(id); n != survivor {
				t.Errorf("sandbox %s placed on %s, want %s", id, n, survivor)
			}
			if err := command(id); err != nil {
				t.Errorf("new sandbox %s: %v", id, err)
			}
		}
	})
}

// runc runs runc on the state root rd.
func runc(ctx context.Context, rd string, args ...string) ([]byte, error) {
	return exec.CommandContext(ctx, "runc", append([]string{"--root", rd}, args...)...).CombinedOutput()
}

// waitFront finds the front through Nomad's service catalog and waits
// until it answers; it returns its URL and the Nomad client it runs on.
func waitFront(t *testing.T, nc *nomadCluster, token string) (string, string) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		var regs []struct {
			Address string
			Port    int
			NodeID  string
		}
		err := nc.get("/v1/service/kiln-front", &regs)
		if err == nil && len(regs) == 1 {
			url := fmt.Sprintf("http://%s:%d", regs[0].Address, regs[0].Port)
			resp, herr := http.Get(url + "/healthz")
			if herr == nil {
				resp.Body.Close()
			}
			if herr == nil && resp.StatusCode == http.StatusOK {
				var node struct{ Name string }
				if err := nc.get("/v1/node/"+regs[0].NodeID, &node); err != nil {
					t.Fatal(err)
				}
				return url, node.Name
			}
			err = fmt.Errorf("front at %s: %v", url, herr)
		}
		if time.Now().After(deadline) {
			out, _ := nc.nomad(context.Background(), "job", "status", "kiln-front")
			t.Fatalf("no front answering: %+v, %v\n%s", regs, err, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// teardown kills the sandboxes still running, stops and purges both
// jobs, stops the agents, then removes what a killed client left: its
// tasks' processes and cgroups, its node's containers and mounts.
func teardown(t *testing.T, nc *nomadCluster, kiln, root string, fc *client.Client, made []string) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if fc != nil {
		for _, id := range made {
			if sb, err := fc.GetSandbox(ctx, id); err == nil && sb.State == "running" {
				if err := fc.KillSandbox(ctx, id); err != nil {
					t.Errorf("killing %s: %v", id, err)
				}
			}
		}
	}
	if t.Failed() {
		for _, job := range []string{"kiln-node", "kiln-front"} {
			out, _ := nc.nomad(ctx, "job", "status", job)
			t.Logf("nomad job status %s:\n%s", job, out)
		}
	}
	for _, job := range []string{"kiln-front", "kiln-node"} {
		if _, err := nc.nomad(ctx, "job", "stop", "-purge", job); err != nil {
			t.Errorf("stopping %s: %v", job, err)
		}
	}
	// The live client stops its tasks (SIGTERM, then the cgroup).
	for deadline := time.Now().Add(40 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		left := procs(kiln, "serve")
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("kiln serve processes %v still running 40 s after the jobs stopped", left)
			break
		}
	}
	if t.Failed() {
		for _, a := range append(nc.servers, nc.clients...) {
			logs, _ := os.ReadFile(a.log)
			t.Logf("%s log:\n%s", a.name, tail(logs, 3000))
		}
	}
	nc.stop()
	nc.removeLeft()
	// A killed node's sandboxes: their containers, then any process of
	// kiln left (shims), then their mounts.
	runDirs, _ := filepath.Glob(filepath.Join(root, "node", "*", "run", "runc"))
	for _, rd := range runDirs {
		out, _ := runc(ctx, rd, "list", "-q")
		for _, id := range strings.Fields(string(out)) {
			if out, err := runc(ctx, rd, "delete", "-f", id); err != nil {
				t.Errorf("removing container %s: %v\n%s", id, err, out)
			}
		}
	}
	for _, pid := range procs(kiln, "") {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	unmountBelow(t, root)
	if err := os.RemoveAll(root); err != nil {
		t.Errorf("removing %s: %v", root, err)
	}
	if left := append(procs(kiln, ""), procs(nomadBin, "", nc.marker())...); len(left) > 0 {
		t.Errorf("processes left after teardown: %v", left)
	}
	t.Logf("teardown in %v", time.Since(start).Round(time.Millisecond))
}
