package cluster_test

import (
	"bufio"
	"context"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/client"
	"github.com/kiln-sh/kiln/internal/cluster"
	"github.com/kiln-sh/kiln/internal/config"
)

// TestClusterPools: pools sized across the cluster and placement that
// prefers a node with a ready pooled sandbox (docs/pools.md, "Pools in a
// cluster"). Nodes a and b keep base=3 across the cluster: 2 each while
// they are the only live nodes, 1 each once node c (no pools) joins, 2
// again once c is lost. Creates through the front that a pooled sandbox
// can serve go to a or b and claim one (their pool hits count them),
// never to c.
func TestClusterPools(t *testing.T) {
	began := time.Now()
	w := newWorld(t)
	front := w.firstFront("front-1")
	pool := "KILN_CLUSTER_POOL=base=3"
	a, b := w.start("node-a", config.RoleNode, "", pool), w.start("node-b", config.RoleNode, "", pool)
	w.ready(a)
	w.ready(b)
	w.waitLive("node-a", "node-b")
	waitPools(t, w, began, map[string]int{"node-a": 2, "node-b": 2})
	t.Logf("2 nodes: 2 pooled sandboxes each, at %v", time.Since(began).Round(time.Millisecond))

	c := w.start("node-c", config.RoleNode, "")
	w.ready(c)
	w.waitLive("node-a", "node-b", "node-c")
	waitPools(t, w, began, map[string]int{"node-a": 1, "node-b": 1, "node-c": 0})
	t.Logf("3 nodes: 1 pooled sandbox each on a and b, at %v", time.Since(began).Round(time.Millisecond))

	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	fc := client.New(front.URL, w.key)
	var ids []string
	last := time.Now()
	for i := range 4 {
		// Each create after both pools reported their sandbox ready
		// again since the last claim (until a node's next report, the
		// front counts a claimed sandbox gone): the front must then pick
		// a or b, whatever the loads.
		waitPools(t, w, last, map[string]int{"node-a": 1, "node-b": 1, "node-c": 0})
		took := time.Now()
		sb, err := fc.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "base", Timeout: 300})
		if err != nil {
			t.Fatalf("create %d: %v", i, err)
		}
		ids, last = append(ids, sb.ID), time.Now()
		node := w.nodeOf(sb.ID)
		t.Logf("create %d: on %s in %v", i, node, time.Since(took).Round(time.Microsecond))
		if node == "node-c" {
			t.Errorf("create %d went to node-c, which has no pool, while a and b had a ready sandbox", i)
		}
	}
	hits := 0
	for _, p := range []*proc{a, b, c} {
		h := poolHits(t, w, p)
		t.Logf("%s: %d pool hits", p.Name, h)
		hits += h
	}
	if hits != len(ids) {
		t.Errorf("pool hits on the nodes: %d, want %d (every create claimed a pooled sandbox)", hits, len(ids))
	}
	for _, id := range ids {
		if err := fc.KillSandbox(ctx, id); err != nil {
			t.Errorf("killing %s: %v", id, err)
		}
	}

	// node-c gone (it holds nothing): a and b each keep 2 again.
	w.kill9(c)
	waitPools(t, w, time.Now(), map[string]int{"node-a": 2, "node-b": 2})
	t.Logf("node-c lost: 2 pooled sandboxes each on a and b again, at %v", time.Since(began).Round(time.Millisecond))
}

// waitPools waits until the catalog shows each node with the given
// number of ready pooled sandboxes of base, reported after since (for a
// number above 0).
func waitPools(t *testing.T, w *world, since time.Time, want map[string]int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ns, err := w.catalog.Nodes(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int{}
		for _, n := range ns {
			// A node without pools writes its empty report once.
			if w, ok := want[n.Name]; ok && n.State == cluster.NodeLive && (w == 0 || n.PoolsAt.After(since)) {
				got[n.Name] = n.Pools["base"]
			}
		}
		if maps.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("ready pooled sandboxes of base by node: %v, want %v", got, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// poolHits reads kiln_pool_hits_total of base from node p's metrics.
func poolHits(t *testing.T, w *world, p *proc) int {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), "GET", p.URL+"/metrics", nil)
	req.Header.Set(cluster.TokenHeader, w.token)
	req.Header.Set("Authorization", "Bearer "+w.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s /metrics: %d", p.Name, resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), `kiln_pool_hits_total{template="base"} `); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %q: %v", p.Name, sc.Text(), err)
			}
			return int(n)
		}
	}
	return 0 // no pool: no series
}
