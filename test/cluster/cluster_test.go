// Package cluster_test runs Kiln as a cluster of real processes on this
// machine: a PostgreSQL catalog, two fronts and three nodes, each a
// `kiln serve` with its own data dir (sharing the built templates), and
// checks placement, routing through either front, node loss and front
// loss (docs/cluster.md).
package cluster_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/client"
	"github.com/kiln-sh/kiln/internal/cluster"
	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/store/postgres/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func TestCluster(t *testing.T) {
	began := time.Now()
	w := newWorld(t)
	t.Logf("built kiln in %v", time.Since(began).Round(time.Millisecond))
	front1 := w.firstFront("front-1")
	key := w.key
	front2 := w.start("front-2", config.RoleFront, "")
	// node-a refuses a key's third sandbox (its per-node quota): fronts
	// must take its refusals (429) to another node.
	nodes := []*proc{w.start("node-a", config.RoleNode, "", "KILN_MAX_SANDBOXES=2"),
		w.start("node-b", config.RoleNode, ""), w.start("node-c", config.RoleNode, "")}
	for _, p := range append([]*proc{front2}, nodes...) {
		w.ready(p)
	}
	w.waitLive("node-a", "node-b", "node-c")
	t.Logf("cluster up at %v", time.Since(began).Round(time.Millisecond))
	fronts := []*client.Client{client.New(front1.URL, key), client.New(front2.URL, key)}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	t.Run("a front lists the nodes", func(t *testing.T) {
		ns, err := fronts[1].Nodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var live []string
		for _, n := range ns {
			if n.State == "live" && n.Slots > 0 && slices.Contains(n.Runtimes, "runc") && slices.Contains(n.Templates, "base") &&
				n.DiskBytes > 0 && n.DiskFreeBytes > 0 && n.DiskFreeBytes <= n.DiskBytes {
				live = append(live, n.Name)
			}
		}
		if !slices.Equal(live, []string{"node-a", "node-b", "node-c"}) {
			t.Errorf("GET /v1/nodes through a front: %+v; want node-a, b and c live with slots, disk, runc and base", ns)
		}
	})

	t.Run("a front serves its metrics and the cluster's", func(t *testing.T) {
		req, _ := http.NewRequestWithContext(ctx, "GET", front2.URL+"/metrics", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, want := range []string{"kiln_cluster_catalog_up 1", `kiln_cluster_nodes{state="live"} 3`,
			`kiln_cluster_node_slots{node="node-b"}`, `kiln_http_request_duration_seconds_count{code="2xx",route="GET /v1/nodes"}`} {
			if resp.StatusCode != 200 || !strings.Contains(string(body), want) {
				t.Errorf("GET /metrics of a front: status %d, no %s in:\n%.2000s", resp.StatusCode, want, body)
			}
		}
	})

	t.Run("node port refuses requests without the token", func(t *testing.T) {
		for _, tok := range []string{"", "wrong-token-wrong-token-wrong-token"} {
			req, _ := http.NewRequest("GET", nodes[0].URL+"/v1/sandboxes", nil)
			req.Header.Set("Authorization", "Bearer "+key)
			if tok != "" {
				req.Header.Set(cluster.TokenHeader, tok)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("node without a valid token (%q): status %d, want 401", tok, resp.StatusCode)
			}
		}
	})

	// 30 sandboxes, 15 through each front, 4 at a time.
	create := func(n int) []string {
		t.Helper()
		ids := make([]string, n)
		errs := make([]error, n)
		sem := make(chan struct{}, 4)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sem <- struct{}{}
				defer func() { <-sem }()
				sb, err := fronts[i%2].CreateSandbox(ctx, api.CreateSandboxRequest{Template: "base", Runtime: "runc", Timeout: 600})
				if err == nil {
					ids[i] = sb.ID
				}
				errs[i] = err
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("creating sandboxes through the fronts: %v", err)
		}
		return ids
	}
	start := time.Now()
	ids := create(30)
	t.Logf("30 creates through the fronts in %v", time.Since(start).Round(time.Millisecond))
	spread := map[string][]string{}
	for _, id := range ids {
		n := w.nodeOf(id)
		spread[n] = append(spread[n], id)
	}
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		if len(spread[n]) < 2 {
			t.Errorf("node %s got %d of %d sandboxes, want at least 2 (spread %v)", n, len(spread[n]), len(ids), counts(spread))
		}
	}
	if len(spread["node-a"]) > 2 {
		t.Errorf("node-a holds %d of the key's sandboxes past its quota of 2", len(spread["node-a"]))
	}
	t.Logf("spread: %v", counts(spread))

	// use checks a command, a file round trip and (with code) a code
	// cell on sandbox id through front f.
	use := func(f *client.Client, id string, code bool) error {
		out, err := f.Output(ctx, id, api.CommandRequest{Cmd: "echo hello-$KILN_SANDBOX_ID"})
		if err != nil {
			return fmt.Errorf("command: %w", err)
		}
		if strings.TrimSpace(out.Stdout) != "hello-"+id {
			return fmt.Errorf("command said %q, want hello-%s", out.Stdout, id)
		}
		body := "written through a front to " + id
		if _, err := f.WriteFile(ctx, id, "/tmp/cluster.txt", strings.NewReader(body)); err != nil {
			return fmt.Errorf("writing a file: %w", err)
		}
		var got bytes.Buffer
		if _, err := f.ReadFile(ctx, id, "/tmp/cluster.txt", &got); err != nil {
			return fmt.Errorf("reading a file: %w", err)
		}
		if got.String() != body {
			return fmt.Errorf("file read back %q, want %q", got.String(), body)
		}
		// The screenshot route goes to the node like the others; base has
		// no desktop, which the node's answer says.
		if _, err := f.Screenshot(ctx, id, ""); !client.IsCode(err, api.CodeFailedPrecondition) || !strings.Contains(err.Error(), "no scrot") {
			return fmt.Errorf("screenshot of a base sandbox: %v, want failed_precondition: no scrot", err)
		}
		if !code {
			return nil
		}
		res, err := f.RunCode(ctx, id, api.CodeRequest{Language: "bash", Code: "echo $((6 * 7))"}, client.CodeOptions{})
		if err != nil {
			return fmt.Errorf("code: %w", err)
		}
		if strings.TrimSpace(res.Stdout) != "42" || res.Error != nil {
			return fmt.Errorf("code cell gave %+v, want 42", res)
		}
		return nil
	}

	t.Run("every sandbox through either front", func(t *testing.T) {
		start := time.Now()
		var wg sync.WaitGroup
		codeOn := map[string]bool{}
		for i, id := range ids {
			code := !codeOn[w.nodeOf(id)] // one code cell per node
			codeOn[w.nodeOf(id)] = true
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := use(fronts[(i+1)%2], id, code); err != nil {
					t.Errorf("sandbox %s on %s: %v", id, w.nodeOf(id), err)
				}
			}()
		}
		wg.Wait()
		t.Logf("used %d sandboxes in %v", len(ids), time.Since(start).Round(time.Millisecond))
	})

	t.Run("streams, PTY, WebSocket and cancellation through a front", func(t *testing.T) {
		// One sandbox per node, through the front that did not create it.
		for _, name := range []string{"node-a", "node-b", "node-c"} {
			id := spread[name][0]
			f, url := fronts[1], front2.URL
			pid, err := f.Start(ctx, id, api.CommandRequest{Cmd: "cat", Stdin: true, PTY: &api.PTYSize{Cols: 80, Rows: 24}})
			if err != nil {
				t.Fatalf("%s: starting a PTY command: %v", name, err)
			}
			wsURL := "ws" + strings.TrimPrefix(url, "http") + fmt.Sprintf("/v1/sandboxes/%s/commands/%d/events", id, pid)
			ws, _, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + key}}})
			if err != nil {
				t.Fatalf("%s: WebSocket through the front: %v", name, err)
			}
			if err := f.Resize(ctx, id, pid, api.PTYSize{Cols: 100, Rows: 30}); err != nil {
				t.Errorf("%s: resize: %v", name, err)
			}
			if err := f.SendStdin(ctx, id, pid, []byte("ping-"+name+"\n"), false); err != nil {
				t.Fatalf("%s: stdin: %v", name, err)
			}
			var seen strings.Builder
			rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
			for !strings.Contains(seen.String(), "ping-"+name) {
				_, msg, err := ws.Read(rctx)
				if err != nil {
					t.Fatalf("%s: reading the WebSocket (output so far %q): %v", name, seen.String(), err)
				}
				var ev api.Event
				if err := json.Unmarshal(msg, &ev); err != nil {
					t.Fatalf("%s: WebSocket message %q: %v", name, msg, err)
				}
				seen.Write(ev.Data)
			}
			rcancel()
			ws.Close(websocket.StatusNormalClosure, "")
			if err := f.Signal(ctx, id, pid, "SIGKILL"); err != nil {
				t.Errorf("%s: signal: %v", name, err)
			}
			// A code cell whose client goes away is interrupted on the
			// node: the context's next cell runs at once, not after
			// the first one's sleep.
			cctx, ccancel := context.WithTimeout(ctx, time.Second)
			_, err = f.RunCode(cctx, id, api.CodeRequest{Language: "bash", Code: "sleep 20; echo late"}, client.CodeOptions{})
			ccancel()
			if err == nil {
				t.Fatalf("%s: a 20 s cell under a 1 s deadline returned without error", name)
			}
			start := time.Now()
			res, err := f.RunCode(ctx, id, api.CodeRequest{Language: "bash", Code: "echo next"}, client.CodeOptions{})
			if err != nil || strings.TrimSpace(res.Stdout) != "next" {
				t.Errorf("%s: the cell after a cancelled one: %+v, %v", name, res, err)
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("%s: the cell after a cancelled one took %v: the cancellation did not reach the node", name, d)
			}
		}
	})

	t.Run("E2B control and data plane through the fronts", func(t *testing.T) {
		call := func(method, url string, body string, hdr ...string) (int, []byte) {
			t.Helper()
			req, _ := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
			for i := 0; i < len(hdr); i += 2 {
				if strings.EqualFold(hdr[i], "Host") {
					req.Host = hdr[i+1]
				} else {
					req.Header.Set(hdr[i], hdr[i+1])
				}
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatalf("%s %s: %v", method, url, err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, b
		}
		// Three creates through front-1: placed like native ones.
		var made []e2bSandbox
		for range 3 {
			st, b := call("POST", front1.URL+"/v2/sandboxes", `{"templateID":"base","timeout":300}`, "X-API-Key", key)
			var sb e2bSandbox
			if st != http.StatusCreated || json.Unmarshal(b, &sb) != nil || sb.SandboxID == "" {
				t.Fatalf("E2B create through front-1: %d %s", st, b)
			}
			made = append(made, sb)
		}
		for _, sb := range made {
			id, node := sb.SandboxID, w.nodeOf(sb.SandboxID)
			// Control plane through the other front, whatever the node.
			if st, b := call("POST", front2.URL+"/sandboxes/"+id+"/timeout", `{"timeout":600}`, "X-API-Key", key); st != http.StatusNoContent {
				t.Errorf("E2B set timeout of %s (on %s) through front-2: %d %s", id, node, st, b)
			}
			if st, b := call("GET", front2.URL+"/sandboxes/"+id, "", "X-API-Key", key); st != http.StatusOK || !strings.Contains(string(b), id) {
				t.Errorf("E2B get of %s (on %s) through front-2: %d %s", id, node, st, b)
			}
			// Data plane: envd's /files by routing headers and by host.
			if _, err := fronts[0].WriteFile(ctx, id, "/tmp/e2b.txt", strings.NewReader("via envd "+id)); err != nil {
				t.Fatalf("writing a file in %s: %v", id, err)
			}
			for _, route := range [][]string{
				{"E2b-Sandbox-Id", id, "E2b-Sandbox-Port", "49983"},
				{"Host", "49983-" + id + ".cluster.test"},
			} {
				hdr := append([]string{"X-Access-Token", sb.EnvdAccessToken}, route...)
				st, b := call("GET", front2.URL+"/files?path=/tmp/e2b.txt&username=user", "", hdr...)
				if st != http.StatusOK || string(b) != "via envd "+id {
					t.Errorf("envd /files of %s (on %s) through front-2 routed by %s: %d %q", id, node, route[0], st, b)
				}
			}
		}
		if st, b := call("GET", front2.URL+"/health", "", "E2b-Sandbox-Id", "nosuchsandbox1", "E2b-Sandbox-Port", "49983"); st != http.StatusBadGateway {
			t.Errorf("data plane of an unknown sandbox: %d %s, want 502", st, b)
		}
		st, b := call("GET", front2.URL+"/v2/sandboxes", "", "X-API-Key", key)
		for _, sb := range made {
			if st != http.StatusOK || !strings.Contains(string(b), sb.SandboxID) {
				t.Errorf("E2B list through front-2 lacks %s: %d %s", sb.SandboxID, st, b)
			}
		}
		for i, sb := range made {
			f := []*proc{front1, front2}[i%2]
			if st, b := call("DELETE", f.URL+"/sandboxes/"+sb.SandboxID, "", "X-API-Key", key); st != http.StatusNoContent {
				t.Errorf("E2B kill of %s through %s: %d %s", sb.SandboxID, f.Name, st, b)
			}
			if st, _ := call("GET", front2.URL+"/sandboxes/"+sb.SandboxID, "", "X-API-Key", key); st != http.StatusNotFound {
				t.Errorf("E2B get of killed sandbox %s: %d, want 404", sb.SandboxID, st)
			}
		}
	})

	t.Run("the proxy's cost per command", func(t *testing.T) {
		id := spread["node-c"][0]
		direct := client.New(nodes[2].URL, key, client.WithHTTPClient(&http.Client{Transport: tokenTransport{w.token}}))
		one := func(c *client.Client) time.Duration {
			start := time.Now()
			if _, err := c.Output(ctx, id, api.CommandRequest{Args: []string{"true"}}); err != nil {
				t.Fatal(err)
			}
			return time.Since(start)
		}
		// Interleaved, and the medians: this machine is shared and noisy.
		var ds, fs []time.Duration
		for i := range 31 {
			d, f := one(direct), one(fronts[0])
			if i > 0 { // the first warms both paths' connections
				ds, fs = append(ds, d), append(fs, f)
			}
		}
		slices.Sort(ds)
		slices.Sort(fs)
		d, f := ds[len(ds)/2], fs[len(fs)/2]
		t.Logf("a command round trip (median of 30): %v straight to the node, %v through a front (+%v)", d.Round(10*time.Microsecond),
			f.Round(10*time.Microsecond), (f - d).Round(10*time.Microsecond))
	})

	t.Run("one request id for the front and the node", func(t *testing.T) {
		id := spread["node-b"][0]
		req, _ := http.NewRequestWithContext(ctx, "GET", front1.URL+"/v1/sandboxes/"+id+"/files?path=/no/such/file", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var e api.Error
		_ = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		rid := resp.Header.Values("X-Request-Id")
		if resp.StatusCode != http.StatusNotFound || len(rid) != 1 || e.RequestID != rid[0] {
			t.Fatalf("a node's error through a front: %d, X-Request-Id %v, body %+v; want 404 with one id, the body's", resp.StatusCode, rid, e)
		}
		// Each process writes its request log line once the answer is
		// out: wait for it.
		for _, p := range []*proc{front1, nodes[1]} {
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				logs, _ := os.ReadFile(p.Log)
				if strings.Contains(string(logs), `"request_id":"`+rid[0]+`"`) {
					break
				}
				if time.Now().After(deadline) {
					t.Errorf("%s's log has no line with request id %s", p.Name, rid[0])
					break
				}
			}
		}
	})

	t.Run("hostile requests to a front", func(t *testing.T) {
		id := spread["node-c"][0]
		auth := []string{"Authorization", "Bearer " + key}
		for _, tc := range []struct {
			method, path, body string
			hdr                []string
			status             int
		}{
			{"POST", "/v1/sandboxes", `{"template":"base"}`, nil, http.StatusUnauthorized},
			{"POST", "/v1/sandboxes", `{"template":"base"}`, []string{"Authorization", "Bearer e2b_" + strings.Repeat("0", 40)}, http.StatusUnauthorized},
			{"POST", "/v1/sandboxes", `{"template":`, auth, http.StatusBadRequest},
			{"POST", "/v1/sandboxes", `{"template":"base","bogus":1}`, auth, http.StatusBadRequest},
			{"POST", "/v1/sandboxes", `{"template":"base","runtime":"kata"}`, auth, http.StatusBadRequest},
			{"POST", "/v1/sandboxes", `{"template":"base","timeout":-1}`, auth, http.StatusBadRequest},
			{"POST", "/v1/sandboxes", `{"template":"base","limits":{"cpus":-1}}`, auth, http.StatusBadRequest},
			{"POST", "/v1/sandboxes", `{"template":"` + strings.Repeat("x", 2<<20) + `"}`, auth, http.StatusBadRequest},
			{"POST", "/v1/sandboxes/NOT-AN-ID/commands", `{"cmd":"true"}`, auth, http.StatusBadRequest},
			{"POST", "/v1/sandboxes/nosuchsandbox1/commands", `{"cmd":"true"}`, auth, http.StatusNotFound},
			{"DELETE", "/v1/sandboxes/nosuchsandbox1", "", auth, http.StatusNotFound},
			{"GET", "/v1/sandboxes/" + id + "/files?path=/etc/hostname", "", nil, http.StatusUnauthorized},
			// The client's own token header is replaced, never trusted.
			{"GET", "/v1/sandboxes/" + id, "", []string{cluster.TokenHeader, w.token}, http.StatusUnauthorized},
			{"GET", "/v1/sandboxes?state=bogus", "", auth, http.StatusBadRequest},
			{"GET", "/health", "", []string{"E2b-Sandbox-Id", "../../etc", "E2b-Sandbox-Port", "49983"}, http.StatusBadGateway},
			{"GET", "/sandboxes/NOT-AN-ID", "", []string{"X-API-Key", key}, http.StatusNotFound},
		} {
			req, _ := http.NewRequestWithContext(ctx, tc.method, front1.URL+tc.path, strings.NewReader(tc.body))
			for i := 0; i < len(tc.hdr); i += 2 {
				req.Header.Set(tc.hdr[i], tc.hdr[i+1])
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Errorf("%s %.60s: %v", tc.method, tc.path, err)
				continue
			}
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Errorf("%s %.60s %.40s: %d %s, want %d", tc.method, tc.path, tc.body, resp.StatusCode, b, tc.status)
			}
		}
		if _, err := fronts[0].GetSandbox(ctx, id); err != nil {
			t.Errorf("the front after hostile requests: %v", err)
		}
	})

	t.Run("a sandbox with a volume goes to the volume's node", func(t *testing.T) {
		// A key of its own (made through a front, held in the catalog):
		// the admin key is at node-a's quota.
		k, err := fronts[0].CreateKey(ctx, api.CreateKeyRequest{Name: "volumes"})
		if err != nil {
			t.Fatalf("creating a key through a front: %v", err)
		}
		fronts := []*client.Client{client.New(front1.URL, k.Secret), client.New(front2.URL, k.Secret)}
		vol, err := fronts[0].CreateVolume(ctx, "cluster-data", 32<<20)
		if err != nil {
			t.Fatalf("creating a volume through a front: %v", err)
		}
		rec, err := w.catalog.GetVolume(ctx, vol.ID)
		if err != nil {
			t.Fatal(err)
		}
		// A volume stays mounted on its node: a failed step must still
		// delete it, after the sandboxes that use it.
		var made []string
		deleted := false
		t.Cleanup(func() {
			for _, id := range made {
				_ = fronts[0].KillSandbox(context.Background(), id)
			}
			if !deleted {
				if err := fronts[0].DeleteVolume(context.Background(), vol.ID); err != nil {
					t.Errorf("deleting the volume: %v", err)
				}
			}
		})
		for i := range 3 {
			sb, err := fronts[i%2].CreateSandbox(ctx, api.CreateSandboxRequest{Template: "base", Runtime: "runc",
				Volumes: []api.VolumeMount{{Volume: "cluster-data", Path: "/mnt/data"}}})
			if err != nil {
				t.Fatalf("creating a sandbox with the volume: %v", err)
			}
			made = append(made, sb.ID)
			if n := w.nodeOf(sb.ID); n != rec.Node {
				t.Errorf("sandbox %s with volume on %s placed on %s", sb.ID, rec.Node, n)
			}
			out, err := fronts[(i+1)%2].Output(ctx, sb.ID, api.CommandRequest{Cmd: fmt.Sprintf("echo %d >> /mnt/data/log; cat /mnt/data/log", i)})
			if err != nil || strings.Fields(out.Stdout)[len(strings.Fields(out.Stdout))-1] != fmt.Sprint(i) {
				t.Errorf("using the volume in %s: %+v, %v", sb.ID, out, err)
			}
			if err := fronts[i%2].KillSandbox(ctx, sb.ID); err != nil {
				t.Errorf("killing %s: %v", sb.ID, err)
			}
		}
		if _, err := fronts[1].GetVolume(ctx, "cluster-data"); err != nil {
			t.Errorf("getting the volume through the other front: %v", err)
		}
		if err := fronts[1].DeleteVolume(ctx, "cluster-data"); err != nil {
			t.Errorf("deleting the volume through the other front: %v", err)
		}
		deleted = true
		dataDir := map[string]string{}
		for _, p := range nodes {
			dataDir[p.Name] = p.Cmd.Args[slices.Index(p.Cmd.Args, "--data-dir")+1]
		}
		if _, err := os.Stat(filepath.Join(dataDir[rec.Node], "volumes", vol.ID)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the deleted volume's files on %s: %v, want them gone", rec.Node, err)
		}
	})

	t.Run("a key's quota holds across the cluster", func(t *testing.T) {
		k, err := fronts[0].CreateKey(ctx, api.CreateKeyRequest{Name: "quota", MaxSandboxes: 3})
		if err != nil {
			t.Fatal(err)
		}
		fs := []*client.Client{client.New(front1.URL, k.Secret), client.New(front2.URL, k.Secret)}
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			made []string
			over int
		)
		for i := range 5 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sb, err := fs[i%2].CreateSandbox(ctx, api.CreateSandboxRequest{Template: "base", Runtime: "runc"})
				var ce *client.Error
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					made = append(made, sb.ID)
				case errors.As(err, &ce) && ce.Status == http.StatusTooManyRequests && strings.Contains(ce.Message, "quota"):
					over++
				default:
					t.Errorf("create: %v", err)
				}
			}()
		}
		wg.Wait()
		if len(made) != 3 || over != 2 {
			t.Errorf("5 concurrent creates through two fronts for a key of 3: %d made, %d refused; want 3 and 2", len(made), over)
		}
		for i, id := range made {
			if err := fs[i%2].KillSandbox(ctx, id); err != nil {
				t.Errorf("killing %s: %v", id, err)
			}
		}
		if sb, err := fs[1].CreateSandbox(ctx, api.CreateSandboxRequest{Template: "base", Runtime: "runc"}); err != nil {
			t.Errorf("a create once the key's sandboxes are killed: %v", err)
		} else if err := fs[1].KillSandbox(ctx, sb.ID); err != nil {
			t.Errorf("killing %s: %v", sb.ID, err)
		}
	})

	t.Run("a list through one front sees all", func(t *testing.T) {
		listed := map[string]string{}
		for sb, err := range fronts[1].AllSandboxes(ctx, client.ListFilter{States: []string{"running"}}) {
			if err != nil {
				t.Fatal(err)
			}
			listed[sb.ID] = sb.State
		}
		for _, id := range ids {
			if listed[id] != "running" {
				t.Errorf("front-2's list lacks running sandbox %s (on %s)", id, w.nodeOf(id))
			}
		}
	})

	// kill -9 of a node: its sandboxes are reported lost with a reason
	// within a bounded wait; the others work; new creates avoid it.
	victim := nodes[1]
	lost := spread[victim.Name]
	killedAt := time.Now()
	w.kill9(victim)
	victimDir := victim.Cmd.Args[slices.Index(victim.Cmd.Args, "--data-dir")+1]
	restarted := false
	t.Cleanup(func() {
		// Its sandboxes still run: only its restart (adoption) removes
		// them.
		if !restarted {
			w.ready(w.start(victim.Name, config.RoleNode, victimDir))
		}
	})
	t.Run("a dead node not yet marked lost fails fast, naming it", func(t *testing.T) {
		start := time.Now()
		_, err := fronts[0].Output(ctx, lost[0], api.CommandRequest{Cmd: "true"})
		var ce *client.Error
		if time.Since(killedAt) > heartbeat*lostAfter {
			t.Skip("the node was marked lost already (slow machine)")
		}
		if !errors.As(err, &ce) || ce.Status != http.StatusServiceUnavailable || !strings.Contains(ce.Message, victim.Name) {
			t.Errorf("command on a sandbox of a dead node: %v; want 503 naming %s", err, victim.Name)
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("the dead node's request took %v, want it to fail fast", d)
		}
		// Creates meanwhile pass over it (its connection is refused:
		// nothing was delivered, so another node may take them).
		for range 2 {
			sb, err := fronts[1].CreateSandbox(ctx, api.CreateSandboxRequest{Template: "base", Runtime: "runc"})
			if err != nil {
				t.Fatalf("create while a node is dead but not yet lost: %v", err)
			}
			if n := w.nodeOf(sb.ID); n == victim.Name {
				t.Errorf("sandbox %s placed on dead node %s", sb.ID, n)
			}
			ids = append(ids, sb.ID)
		}
	})
	t.Run("a killed node's sandboxes are reported lost", func(t *testing.T) {
		deadline := killedAt.Add(heartbeat*lostAfter + 10*time.Second)
		for _, id := range lost {
			for {
				sb, err := fronts[0].GetSandbox(ctx, id)
				if err == nil && sb.State == "failed" {
					if !strings.Contains(sb.Reason, "node "+victim.Name+" lost") {
						t.Errorf("lost sandbox %s has reason %q, want one naming node %s", id, sb.Reason, victim.Name)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("sandbox %s of killed node %s: %+v, %v; want failed (lost) by now", id, victim.Name, sb, err)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
		t.Logf("lost reported %v after the kill", time.Since(killedAt).Round(time.Millisecond))
		ns, err := fronts[0].Nodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range ns {
			if n.Name == victim.Name && (n.State != "lost" || !strings.Contains(n.Reason, "no heartbeat")) {
				t.Errorf("GET /v1/nodes shows the killed node as %+v, want lost with a reason", n)
			}
		}
		_, err = fronts[1].Output(ctx, lost[0], api.CommandRequest{Cmd: "true"})
		var ce *client.Error
		if !errors.As(err, &ce) || ce.Status != http.StatusConflict || !strings.Contains(ce.Message, "lost") {
			t.Errorf("command on a lost sandbox: %v; want 409 naming the loss", err)
		}
		if err := fronts[1].KillSandbox(ctx, lost[0]); err != nil {
			t.Errorf("killing a lost sandbox: %v, want success (it ended)", err)
		}
	})
	t.Run("the other nodes' sandboxes still work", func(t *testing.T) {
		for _, n := range []*proc{nodes[0], nodes[2]} {
			id := spread[n.Name][0]
			if err := use(fronts[1], id, false); err != nil {
				t.Errorf("sandbox %s on %s: %v", id, n.Name, err)
			}
			if sb, err := fronts[0].GetSandbox(ctx, id); err != nil || sb.State != "running" {
				t.Errorf("sandbox %s on live node %s: %+v, %v; want running", id, n.Name, sb, err)
			}
		}
	})
	t.Run("new creates go to the surviving nodes", func(t *testing.T) {
		more := create(4)
		for _, id := range more {
			if n := w.nodeOf(id); n == victim.Name {
				t.Errorf("sandbox %s placed on lost node %s", id, n)
			}
		}
		ids = append(ids, more...)
	})

	// kill -9 of a front: the other serves everything.
	w.kill9(front1)
	t.Run("the other front serves everything after a front dies", func(t *testing.T) {
		alive := 0
		for sb, err := range fronts[1].AllSandboxes(ctx, client.ListFilter{}) {
			if err != nil {
				t.Fatal(err)
			}
			if sb.State == "running" {
				alive++
			}
		}
		if want := len(ids) - len(lost); alive != want {
			t.Errorf("front-2 lists %d running sandboxes, want %d", alive, want)
		}
		for _, n := range []*proc{nodes[0], nodes[2]} {
			id := spread[n.Name][len(spread[n.Name])-1]
			if err := use(fronts[1], id, false); err != nil {
				t.Errorf("sandbox %s on %s through front-2: %v", id, n.Name, err)
			}
		}
		sb, err := fronts[1].CreateSandbox(ctx, api.CreateSandboxRequest{Template: "base", Runtime: "runc"})
		if err != nil {
			t.Fatalf("create through front-2: %v", err)
		}
		ids = append(ids, sb.ID)
		if err := fronts[1].KillSandbox(ctx, sb.ID); err != nil {
			t.Errorf("kill through front-2: %v", err)
		}
	})

	// The killed node comes back on its data dir: live again, and the
	// sandboxes the catalog declared lost are cleaned up, not revived.
	t.Run("a lost node restarted cleans up its lost sandboxes", func(t *testing.T) {
		dataDir := victimDir
		back := w.start(victim.Name, config.RoleNode, dataDir)
		restarted = true
		w.ready(back)
		w.waitLive(victim.Name)
		for _, id := range lost {
			if _, err := os.Stat(filepath.Join(dataDir, "sandboxes", id)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("lost sandbox %s's dir after its node restarted: %v, want it removed", id, err)
			}
			if sb, err := fronts[1].GetSandbox(ctx, id); err != nil || sb.State != "failed" {
				t.Errorf("lost sandbox %s after its node restarted: %+v, %v; want still failed", id, sb, err)
			}
		}
	})

	// A node frozen past the silence (a partition, a stopped process) is
	// marked lost while it still runs; once it answers again it ends the
	// sandboxes the catalog failed, keeping their lost reason.
	t.Run("a frozen node that comes back ends its lost sandboxes", func(t *testing.T) {
		frozen := nodes[2]
		frozenDir := frozen.Cmd.Args[slices.Index(frozen.Cmd.Args, "--data-dir")+1]
		recs, _, err := w.catalog.ListSandboxes(ctx, sandbox.Filter{Node: frozen.Name, States: []sandbox.State{sandbox.StateRunning}})
		if err != nil || len(recs) == 0 {
			t.Fatalf("running sandboxes of %s: %v, %v", frozen.Name, recs, err)
		}
		w.freeze(frozen)
		stopped := true
		defer func() {
			if stopped {
				_ = frozen.Cmd.Process.Signal(syscall.SIGCONT)
			}
		}()
		deadline := time.Now().Add(heartbeat*lostAfter + 10*time.Second)
		for _, rec := range recs {
			for {
				sb, err := w.catalog.GetSandbox(ctx, rec.ID)
				if err == nil && sb.State == sandbox.StateFailed {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("sandbox %s of frozen node %s: %+v, %v; want failed (lost) by now", rec.ID, frozen.Name, sb, err)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
		_ = frozen.Cmd.Process.Signal(syscall.SIGCONT)
		stopped = false
		w.waitLive(frozen.Name)
		deadline = time.Now().Add(15 * time.Second)
		for _, rec := range recs {
			for {
				_, statErr := os.Stat(filepath.Join(frozenDir, "sandboxes", rec.ID.String()))
				sb, err := w.catalog.GetSandbox(ctx, rec.ID)
				if errors.Is(statErr, os.ErrNotExist) && err == nil && sb.State == sandbox.StateFailed {
					if !strings.Contains(sb.Reason, "node "+frozen.Name+" lost") {
						t.Errorf("sandbox %s ended by its revived node with reason %q, want the lost reason", rec.ID, sb.Reason)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("sandbox %s of revived node %s: dir %v, record %+v, %v; want it removed and failed", rec.ID, frozen.Name, statErr, sb, err)
				}
				time.Sleep(100 * time.Millisecond)
			}
			ids = slices.DeleteFunc(ids, func(id string) bool { return id == rec.ID.String() })
		}
	})

	for _, id := range ids {
		if slices.Contains(lost, id) {
			continue // its node's restart removed it
		}
		if err := fronts[1].KillSandbox(ctx, id); err != nil {
			t.Errorf("killing %s: %v", id, err)
		}
	}
	t.Logf("TestCluster took %v", time.Since(began).Round(time.Millisecond))
}

// tokenTransport adds the cluster token, as a front does.
type tokenTransport struct{ token string }

func (tt tokenTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(cluster.TokenHeader, tt.token)
	return http.DefaultTransport.RoundTrip(r)
}

// e2bSandbox is what E2B's create answers, in part.
type e2bSandbox struct {
	SandboxID       string `json:"sandboxID"`
	EnvdAccessToken string `json:"envdAccessToken"`
}

func counts(m map[string][]string) map[string]int {
	out := map[string]int{}
	for k, v := range m {
		out[k] = len(v)
	}
	return out
}
