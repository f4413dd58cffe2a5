package cluster_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/kiln-sh/kiln/internal/cluster"
	"github.com/kiln-sh/kiln/internal/errdefs"
)

func n(name string, sandboxes, slots int, runtimes ...string) cluster.Node {
	return cluster.Node{Name: name, State: cluster.NodeLive, Slots: slots, Sandboxes: sandboxes,
		MemoryBytes: 16 << 30, Runtimes: runtimes}
}

// disk gives n a data dir of total bytes with free of them free.
func disk(n cluster.Node, total, free int64) cluster.Node {
	n.DiskBytes, n.DiskFreeBytes = total, free
	return n
}

func names(ns []cluster.Node) []string {
	var out []string
	for _, n := range ns {
		out = append(out, n.Name)
	}
	return out
}

func TestPlace(t *testing.T) {
	lost := n("lost", 0, 10, "runc", "runsc")
	lost.State = cluster.NodeLost
	memFull := n("mem", 0, 10, "runc")
	memFull.AllocatedMemoryBytes = 15 << 30
	reserved := n("reserved", 1, 4, "runc")
	reserved.Reserved = 3 // full with its reservations
	holds := func(nd cluster.Node, builds ...string) cluster.Node { nd.Builds = builds; return nd }
	tests := []struct {
		name  string
		nodes []cluster.Node
		want  cluster.Want
		k     int
		order []string // nil: only check the error
		err   error
	}{
		{"least loaded first (K covers all)", []cluster.Node{n("a", 5, 10, "runc"), n("b", 1, 10, "runc"), n("c", 3, 10, "runc")},
			cluster.Want{}, 3, []string{"b", "c", "a"}, nil},
		{"runtime honoured", []cluster.Node{n("a", 0, 10, "runc"), n("b", 9, 10, "runsc", "runc")},
			cluster.Want{Runtime: "runsc"}, 3, []string{"b"}, nil},
		{"lost and full nodes left out", []cluster.Node{lost, n("full", 10, 10, "runc"), reserved, n("ok", 9, 10, "runc")},
			cluster.Want{}, 3, []string{"ok"}, nil},
		{"memory counts as load", []cluster.Node{memFull, n("b", 5, 10, "runc")},
			cluster.Want{}, 2, []string{"b", "mem"}, nil},
		{"a required node", []cluster.Node{n("a", 0, 10, "runc"), n("b", 5, 10, "runc")},
			cluster.Want{Node: "b"}, 3, []string{"b"}, nil},
		{"a required node that is full", []cluster.Node{n("a", 0, 10, "runc"), n("b", 10, 10, "runc")},
			cluster.Want{Node: "b"}, 3, nil, errdefs.ErrUnavailable},
		{"nodes holding the build first, then by load", []cluster.Node{n("a", 0, 10, "runc"), holds(n("b", 8, 10, "runc"), "bx"),
			holds(n("c", 5, 10, "runc"), "by", "bx"), holds(n("d", 1, 10, "runc"), "by")},
			cluster.Want{Build: "bx"}, 4, []string{"c", "b", "a", "d"}, nil},
		{"a full node holding the build is passed over", []cluster.Node{n("a", 3, 10, "runc"), holds(n("b", 10, 10, "runc"), "bx")},
			cluster.Want{Build: "bx"}, 3, []string{"a"}, nil},
		{"a preferred node first", []cluster.Node{n("a", 0, 10, "runc"), n("b", 5, 10, "runc"), n("c", 2, 10, "runc")},
			cluster.Want{Prefer: "b"}, 3, []string{"b", "a", "c"}, nil},
		{"a preferred node that is lost: the others", []cluster.Node{lost, n("b", 5, 10, "runc", "runsc"), n("c", 2, 10, "runc", "runsc")},
			cluster.Want{Runtime: "runsc", Prefer: "lost"}, 3, []string{"c", "b"}, nil},
		{"no live node", []cluster.Node{lost}, cluster.Want{}, 3, nil, errdefs.ErrUnavailable},
		{"no node at all", nil, cluster.Want{}, 3, nil, errdefs.ErrUnavailable},
		{"every node full", []cluster.Node{n("full", 10, 10, "runc")}, cluster.Want{}, 3, nil, errdefs.ErrResourceExhausted},
		{"a node short of disk is passed over", []cluster.Node{disk(n("a", 0, 10, "runc"), 100<<30, 512<<20),
			disk(n("b", 5, 10, "runc"), 100<<30, 2<<30), n("c", 8, 10, "runc")}, cluster.Want{}, 3, []string{"b", "c"}, nil},
		{"every node short of disk", []cluster.Node{disk(n("a", 0, 10, "runc"), 100<<30, 0)}, cluster.Want{}, 3, nil, errdefs.ErrResourceExhausted},
		{"no node has the runtime", []cluster.Node{n("a", 0, 10, "runc")}, cluster.Want{Runtime: "runsc"}, 3, nil, errdefs.ErrResourceExhausted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := cluster.Place(slices.Clone(tt.nodes), tt.want, tt.k)
			if !errors.Is(err, tt.err) || (tt.err == nil) != (err == nil) {
				t.Fatalf("Place = %v, %v; want error %v", names(got), err, tt.err)
			}
			if tt.order != nil && !slices.Equal(names(got), tt.order) {
				t.Errorf("Place order = %v, want %v", names(got), tt.order)
			}
		})
	}
}

// TestPlaceSamplesK: with K=1 the first choice is a random node, so
// creates spread even when one node is the least loaded; every node
// still comes once, for retries.
func TestPlaceSamplesK(t *testing.T) {
	ns := []cluster.Node{n("a", 0, 10, "runc"), n("b", 1, 10, "runc"), n("c", 2, 10, "runc")}
	first := map[string]int{}
	for range 300 {
		got, err := cluster.Place(slices.Clone(ns), cluster.Want{}, 1)
		if err != nil {
			t.Fatal(err)
		}
		if s := slices.Sorted(slices.Values(names(got))); !slices.Equal(s, []string{"a", "b", "c"}) {
			t.Fatalf("Place = %v, want every node once", names(got))
		}
		first[got[0].Name]++
	}
	for _, name := range []string{"a", "b", "c"} {
		if first[name] < 50 {
			t.Errorf("first choices with K=1: %v; want each node often", first)
		}
	}
}

// TestAffine: a key's node is the same whatever the nodes' order, never
// a lost one, and moves only when its own node goes; keys spread over
// the nodes.
func TestAffine(t *testing.T) {
	ns := []cluster.Node{n("a", 0, 10, "runc"), n("b", 0, 10, "runc"), n("c", 0, 10, "runc"), n("d", 0, 10, "runc")}
	if _, ok := cluster.Affine(nil, "k"); ok {
		t.Error("Affine of no node found one")
	}
	spread := map[string]int{}
	for i := range 200 {
		key := fmt.Sprintf("key_%d", i)
		first, ok := cluster.Affine(ns, key)
		if !ok {
			t.Fatal("no node")
		}
		spread[first.Name]++
		rev := slices.Clone(ns)
		slices.Reverse(rev)
		if again, _ := cluster.Affine(rev, key); again.Name != first.Name {
			t.Fatalf("%s: %s, then %s in another order", key, first.Name, again.Name)
		}
		// Another node lost: the key stays; its own lost: it moves.
		for j := range ns {
			less := slices.Clone(ns)
			less[j].State = cluster.NodeLost
			got, _ := cluster.Affine(less, key)
			if (ns[j].Name == first.Name) != (got.Name != first.Name) {
				t.Fatalf("%s on %s; with %s lost: %s", key, first.Name, ns[j].Name, got.Name)
			}
		}
	}
	for _, nd := range ns {
		if spread[nd.Name] < 20 {
			t.Errorf("200 keys over 4 nodes: %v; want each node some", spread)
		}
	}
}

// BenchmarkPlace: a front's placement decision over a large cluster (the
// catalog query it follows is not included).
func BenchmarkPlace(b *testing.B) {
	for _, size := range []int{10, 1000} {
		ns := make([]cluster.Node, size)
		for i := range ns {
			ns[i] = n(fmt.Sprintf("node-%d", i), i%50, 64, "runc", "runsc")
		}
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			work := make([]cluster.Node, size)
			for b.Loop() {
				copy(work, ns)
				if _, err := cluster.Place(work, cluster.Want{Runtime: "runsc"}, 3); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
