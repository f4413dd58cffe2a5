package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/store"
)

// testNodePools: a node's pool report is kept with its time, replaced by
// the next, left alone by heartbeats; none reported is nil and a zero
// time; an unknown node is not found.
func testNodePools(t *testing.T, s store.Backend) {
	heartbeat(t, s, node("pooled", 10), node("plain", 10))
	if n := nodes(t, s)["plain"]; n.Pools != nil || !n.PoolsAt.IsZero() {
		t.Errorf("a node that reported no pools: %v at %v; want nil at the zero time", n.Pools, n.PoolsAt)
	}
	report := func(ready map[string]int) {
		t.Helper()
		if err := s.SetNodePools(ctx(t), "pooled", ready); err != nil {
			t.Fatalf("SetNodePools: %v", err)
		}
	}
	report(map[string]int{"base": 2, "code-interpreter": 0, "site:v2": 1})
	first := nodes(t, s)["pooled"]
	if diff := cmp.Diff(map[string]int{"base": 2, "code-interpreter": 0, "site:v2": 1}, first.Pools); diff != "" {
		t.Errorf("pools (-want +got):\n%s", diff)
	}
	if time.Since(first.PoolsAt) > time.Minute || time.Until(first.PoolsAt) > time.Minute {
		t.Errorf("PoolsAt = %v, want about now", first.PoolsAt)
	}
	heartbeat(t, s, node("pooled", 10))
	if got := nodes(t, s)["pooled"].Pools; got["base"] != 2 {
		t.Errorf("after a heartbeat, pools = %v; want the report kept", got)
	}
	time.Sleep(2 * time.Millisecond)
	report(map[string]int{"base": 1})
	second := nodes(t, s)["pooled"]
	if diff := cmp.Diff(map[string]int{"base": 1}, second.Pools); diff != "" {
		t.Errorf("pools after a second report (-want +got):\n%s", diff)
	}
	if !second.PoolsAt.After(first.PoolsAt) {
		t.Errorf("PoolsAt %v after a later report, want after %v", second.PoolsAt, first.PoolsAt)
	}
	report(nil)
	if got := nodes(t, s)["pooled"].Pools; got != nil {
		t.Errorf("pools after an empty report = %v, want nil", got)
	}
	if err := s.SetNodePools(ctx(t), "nosuchnode", map[string]int{"base": 1}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("SetNodePools of an unknown node = %v, want not found", err)
	}
}
