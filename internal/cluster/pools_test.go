package cluster_test

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/internal/cluster"
)

func TestPoolSizes(t *testing.T) {
	for _, tc := range []struct {
		local, across map[string]int
		live          int
		want          map[string]int
	}{
		{nil, map[string]int{"code-interpreter": 6}, 3, map[string]int{"code-interpreter": 2}},
		{nil, map[string]int{"code-interpreter": 7}, 3, map[string]int{"code-interpreter": 3}}, // rounded up
		{nil, map[string]int{"base": 3}, 0, map[string]int{"base": 3}},                         // none counted: this one
		{nil, map[string]int{"base": 1000}, 2, map[string]int{"base": 64}},                     // at most MaxPoolSize
		{map[string]int{"base": 4, "site": 1}, map[string]int{"base": 6}, 3, map[string]int{"base": 4, "site": 1}},
		{map[string]int{"base": 1}, map[string]int{"base": 6}, 2, map[string]int{"base": 3}},
		{map[string]int{"base": 1}, nil, 5, map[string]int{"base": 1}},
	} {
		if got := cluster.PoolSizes(tc.local, tc.across, tc.live); !maps.Equal(got, tc.want) {
			t.Errorf("PoolSizes(%v, %v, %d) = %v, want %v", tc.local, tc.across, tc.live, got, tc.want)
		}
	}
}

func TestPoolName(t *testing.T) {
	for in, want := range map[string]string{"base": "base", "site:default": "site", "site:v2": "site:v2", "../x": ""} {
		if got := cluster.PoolName(in); got != want {
			t.Errorf("PoolName(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestPlacePrefersPooled: a node that reported a ready sandbox of the
// create's pool comes first, whatever its load and K; the others follow
// in the usual order.
func TestPlacePrefersPooled(t *testing.T) {
	a, b, c := n("a", 0, 10, "runc"), n("b", 8, 10, "runc"), n("c", 3, 10, "runc")
	b.Pools = map[string]int{"code-interpreter": 1, "base": 0}
	for range 50 {
		got, err := cluster.Place([]cluster.Node{a, b, c}, cluster.Want{Pool: "code-interpreter"}, 1)
		if err != nil || got[0].Name != "b" {
			t.Fatalf("Place with a pool = %v, %v; want b first", names(got), err)
		}
		got, err = cluster.Place([]cluster.Node{a, b, c}, cluster.Want{Pool: "base"}, 3)
		if err != nil || !slices.Equal(names(got), []string{"a", "c", "b"}) {
			t.Fatalf("Place with a pool nobody has ready = %v, %v; want by load", names(got), err)
		}
	}
}

// TestPoolHints: a front sends a node as many creates for its pool as it
// reported ready sandboxes, then places by load again until the node's
// next report.
func TestPoolHints(t *testing.T) {
	at := time.Now()
	a, b := n("a", 5, 10, "runc"), n("b", 0, 10, "runc")
	a.Pools, a.PoolsAt = map[string]int{"base": 2}, at
	var h cluster.PoolHints
	place := func() string {
		t.Helper()
		got, err := h.Place([]cluster.Node{a, b}, cluster.Want{Pool: "base"}, 2)
		if err != nil {
			t.Fatal(err)
		}
		return got[0].Name
	}
	var firsts []string
	for range 4 {
		firsts = append(firsts, place())
	}
	if !slices.Equal(firsts, []string{"a", "a", "b", "b"}) {
		t.Errorf("first choices = %v, want a twice (its 2 ready), then b (less loaded)", firsts)
	}
	if a.Pools["base"] != 2 {
		t.Errorf("the caller's report was changed: %v", a.Pools)
	}
	// A new report (one ready again) counts afresh.
	a.Pools, a.PoolsAt = map[string]int{"base": 1}, at.Add(time.Second)
	if got := []string{place(), place()}; !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("after a new report: %v, want a then b", got)
	}
	// Creates that no pool could serve are placed as ever.
	if got, _ := h.Place([]cluster.Node{a, b}, cluster.Want{}, 2); got[0].Name != "b" {
		t.Errorf("a create without a pool went to %s first", got[0].Name)
	}
}

// BenchmarkPlacePooled: BenchmarkPlace for a create a pooled sandbox
// could serve, through a front's PoolHints, half the nodes having one
// ready.
func BenchmarkPlacePooled(b *testing.B) {
	for _, size := range []int{10, 1000} {
		ns := make([]cluster.Node, size)
		for i := range ns {
			ns[i] = n(fmt.Sprintf("node-%d", i), i%50, 64, "runc", "runsc")
			ns[i].Pools, ns[i].PoolsAt = map[string]int{"code-interpreter": i % 2}, time.Now()
		}
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			var h cluster.PoolHints
			work := make([]cluster.Node, size)
			for b.Loop() {
				copy(work, ns)
				if _, err := h.Place(work, cluster.Want{Runtime: "runsc", Pool: "code-interpreter"}, 3); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
