package sandbox

import (
	"testing"
	"time"
)

// A pool with a burst size is kept at as many ready sandboxes as creates
// asked it for in the last minute, between its size and its burst size;
// fills run burstFillers at a time while demand holds it above its size;
// once demand falls what it holds above its target is shed. A pool
// without a burst size keeps its size whatever the demand.
func TestPoolTargetFollowsDemand(t *testing.T) {
	p := newPools()
	p.targets["base"], p.bursts["base"] = 2, 8
	p.targets["fixed"] = 3
	now := time.Now()
	p.builds["base"], p.builds["fixed"] = "h", "h"

	if got := p.target("base", now); got != 2 {
		t.Fatalf("no demand: target %d, want the size 2", got)
	}
	if _, _, w := p.next(nil, now); w != 1 {
		t.Errorf("no demand: %d fillers, want 1", w)
	}
	for i := range 5 { // a burst of 5 creates within a second
		p.asked("base", now.Add(time.Duration(i)*100*time.Millisecond))
		p.asked("fixed", now)
	}
	at := now.Add(2 * time.Second)
	if got := p.target("base", at); got != 5 {
		t.Errorf("after a burst of 5: target %d, want 5", got)
	}
	if got := p.target("fixed", at); got != 3 {
		t.Errorf("a pool without a burst size: target %d, want its size 3", got)
	}
	name, _, w := p.next(map[string]time.Time{}, at)
	if name != "base" || w != burstFillers {
		t.Errorf("after the burst: next %q with %d fillers, want base with %d", name, w, burstFillers)
	}
	// Fills in flight count: 5 wanted, 2 ready, 3 filling → nothing to do
	// for base; fixed (3 wanted, none ready) is next.
	p.ready["base"] = []*pooled{{hash: "h"}, {hash: "h"}}
	p.filling["base"] = 3
	if name, _, _ := p.next(map[string]time.Time{}, at); name != "fixed" {
		t.Errorf("base full with its fills in flight: next %q, want fixed", name)
	}
	for i := range 20 { // more than the burst size asks: held at 8
		p.asked("base", now.Add(time.Second+time.Duration(i)*time.Millisecond))
	}
	if got := p.target("base", at); got != 8 {
		t.Errorf("25 asked: target %d, want the burst size 8", got)
	}

	// A minute after the burst the target is the size again, and the
	// extra ready sandboxes are shed, the newest first.
	p.filling["base"] = 0
	q := make([]*pooled, 8)
	for i := range q {
		q[i] = &pooled{hash: "h"}
	}
	p.ready["base"] = q
	later := now.Add(time.Second + demandWindow + time.Second)
	if got := p.target("base", later); got != 2 {
		t.Errorf("a minute after: target %d, want 2", got)
	}
	shed := p.shed(later)
	if len(shed) != 6 || len(p.ready["base"]) != 2 || p.ready["base"][0] != q[0] || shed[0] != q[2] {
		t.Errorf("shed %d, kept %d (oldest kept: %v); want 6 shed, the 2 oldest kept", len(shed), len(p.ready["base"]), p.ready["base"][0] == q[0])
	}
	if _, _, w := p.next(nil, later); w != 1 {
		t.Errorf("demand gone: %d fillers, want 1", w)
	}
	// Old demand is forgotten as new comes in.
	p.asked("base", later)
	if n := len(p.demand["base"]); n != 1 {
		t.Errorf("demand kept %d times, want only the last one", n)
	}
}
