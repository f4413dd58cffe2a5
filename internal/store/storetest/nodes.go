package storetest

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/kiln-sh/kiln/internal/cluster"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/store"
)

func node(name string, slots int) cluster.Node {
	return cluster.Node{
		Name: name, URL: "http://" + name + ":8420", CPUs: 2, MemoryBytes: 8 << 30, Slots: slots,
		DiskBytes: 100 << 30, DiskFreeBytes: 40 << 30,
		Runtimes: []string{"runc", "runsc"}, Templates: []string{"base"}, StartedAt: base,
		Builds: []string{"b" + strings.Repeat("x", 24), "b" + strings.Repeat("y", 24)},
	}
}

func heartbeat(t *testing.T, s store.Backend, ns ...cluster.Node) {
	t.Helper()
	for _, n := range ns {
		if revived, err := s.Heartbeat(ctx(t), n); err != nil || revived {
			t.Fatalf("Heartbeat(%s) = %v, %v; want not revived", n.Name, revived, err)
		}
	}
}

func nodes(t *testing.T, s store.Backend) map[string]cluster.Node {
	t.Helper()
	ns, err := s.Nodes(ctx(t))
	if err != nil {
		t.Fatalf("Nodes: %v", err)
	}
	out := map[string]cluster.Node{}
	for _, n := range ns {
		out[n.Name] = n
	}
	return out
}

// testNodeRegistry: a heartbeat registers a node and updates it; Nodes
// counts each node's sandboxes that have not ended and their limits.
func testNodeRegistry(t *testing.T, s store.Backend) {
	a, b := node("node-a", 10), node("node-b", 20)
	b.Templates, b.Builds = nil, nil
	heartbeat(t, s, a, b)
	a.URL, a.Slots, a.Builds = "http://10.0.0.1:8420", 12, append(a.Builds, "b"+strings.Repeat("z", 24))
	heartbeat(t, s, a)

	running := record("nodesrun0001", base)
	running.Node = "node-a"
	paused := record("nodespause01", base)
	paused.Node, paused.State = "node-a", sandbox.StatePaused
	ended := record("nodesended01", base)
	ended.Node, ended.State = "node-a", sandbox.StateStopped
	other := record("nodesother01", base)
	other.Node = "elsewhere"
	put(t, s, running, paused, ended, other)

	got := nodes(t, s)
	if len(got) != 2 {
		t.Fatalf("Nodes = %v, want node-a and node-b", got)
	}
	for _, n := range got {
		if n.HeartbeatAt.IsZero() || time.Since(n.HeartbeatAt) > time.Minute || time.Until(n.HeartbeatAt) > time.Minute {
			t.Errorf("%s: HeartbeatAt = %v, want about now", n.Name, n.HeartbeatAt)
		}
	}
	a.StartedAt, b.StartedAt = base.Truncate(time.Microsecond), base.Truncate(time.Microsecond)
	wantA := a
	wantA.State, wantA.Sandboxes, wantA.AllocatedCPUs, wantA.AllocatedMemoryBytes = cluster.NodeLive, 2, 2, 1<<30
	wantB := b
	wantB.State, wantB.Templates, wantB.Builds = cluster.NodeLive, []string{}, []string{}
	ignore := cmpopts.IgnoreFields(cluster.Node{}, "HeartbeatAt", "Quiet", "ReadAt")
	if diff := cmp.Diff(wantA, got["node-a"], ignore); diff != "" {
		t.Errorf("node-a (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(wantB, got["node-b"], ignore); diff != "" {
		t.Errorf("node-b (-want +got):\n%s", diff)
	}
	for _, n := range got {
		if q := n.QuietFor(time.Now()); q < -time.Minute || q > time.Minute {
			t.Errorf("%s: quiet for %v just after its heartbeat", n.Name, q)
		}
	}

	// A draining node says so at each heartbeat and takes no new
	// reservation; a plain heartbeat (its next start) makes it live.
	d := b
	d.State = cluster.NodeDraining
	heartbeat(t, s, d)
	if n := nodes(t, s)["node-b"]; n.State != cluster.NodeDraining || !n.Serving() {
		t.Errorf("node-b after a draining heartbeat: state %q, want draining", n.State)
	}
	if _, err := s.Reserve(ctx(t), cluster.Reservation{Node: "node-b", Owner: "k"}, time.Minute); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("Reserve on a draining node: %v, want unavailable", err)
	}
	heartbeat(t, s, b)
	if n := nodes(t, s)["node-b"]; n.State != cluster.NodeLive {
		t.Errorf("node-b after a live heartbeat: state %q, want live", n.State)
	}
}

// testNodeLost: a silent node is marked lost with its sandboxes that had
// not ended (failed, with a reason naming it), but a paused one whose
// image is in shared storage stays paused and can be moved, once, by
// concurrent movers; others are untouched; a heartbeat brings it back;
// two sweepers at once mark each node once.
func testNodeLost(t *testing.T, s store.Backend) {
	heartbeat(t, s, node("quiet", 10), node("chatty", 10))
	mine := record("lostmine0001", base)
	mine.Node, mine.Metadata, mine.Env = "quiet", map[string]string{"k": "v"}, map[string]string{"SECRET": "x"}
	done := record("lostdone0001", base)
	done.Node, done.State, done.Reason = "quiet", sandbox.StateStopped, "killed"
	theirs := record("losttheirs01", base)
	theirs.Node = "chatty"
	shared := record("lostshared01", base)
	shared.Node, shared.State, shared.Image = "quiet", sandbox.StatePaused, "paused/lostshared01.x@sha256:00"
	local := record("lostlocal001", base)
	local.Node, local.State = "quiet", sandbox.StatePaused
	put(t, s, mine, done, theirs, shared, local)
	if err := s.MoveSandbox(ctx(t), string(shared.ID), "quiet", "chatty"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("MoveSandbox off a live node: %v, want failed_precondition", err)
	}

	if lost, err := s.MarkLost(ctx(t), time.Hour); err != nil || len(lost) != 0 {
		t.Fatalf("MarkLost(1h) = %v, %v; want nothing", lost, err)
	}
	// quiet falls silent for 1 s; chatty has just written: a 500 ms
	// silence is quiet's alone, even on a loaded machine.
	time.Sleep(time.Second)
	heartbeat(t, s, node("chatty", 10))
	// Two sweepers at once: between them they mark "quiet" exactly once.
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		marked []string
	)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lost, err := s.MarkLost(ctx(t), 500*time.Millisecond)
			if err != nil {
				t.Errorf("MarkLost: %v", err)
			}
			mu.Lock()
			defer mu.Unlock()
			for _, n := range lost {
				marked = append(marked, n.Name)
				if n.State != cluster.NodeLost || !strings.Contains(n.Reason, "node quiet lost") {
					t.Errorf("marked %+v, want state lost and a reason naming it", n)
				}
			}
		}()
	}
	wg.Wait()
	if !slices.Equal(marked, []string{"quiet"}) {
		t.Fatalf("marked %v, want [quiet] once", marked)
	}
	got := nodes(t, s)
	if got["quiet"].State != cluster.NodeLost || !strings.Contains(got["quiet"].Reason, "no heartbeat") || got["chatty"].State != cluster.NodeLive {
		t.Errorf("nodes after MarkLost: %+v", got)
	}
	m := get(t, s, mine.ID)
	if m.State != sandbox.StateFailed || !strings.Contains(m.Reason, "node quiet lost") || m.EndedAt.IsZero() ||
		m.Env != nil || m.Metadata != nil {
		t.Errorf("sandbox of the lost node = %+v, want a failed tombstone with the node's reason", m)
	}
	if l, _, err := s.ListSandboxes(ctx(t), sandbox.Filter{Metadata: map[string]string{"k": "v"}}); err != nil || len(l) != 0 {
		t.Errorf("metadata filter after MarkLost = %v, %v; want nothing (a tombstone has no metadata)", ids(l), err)
	}
	if d := get(t, s, done.ID); d.State != sandbox.StateStopped || d.Reason != "killed" {
		t.Errorf("ended sandbox of the lost node = %+v, want it untouched", d)
	}
	if l := get(t, s, local.ID); l.State != sandbox.StateFailed || !strings.Contains(l.Reason, "node quiet lost") {
		t.Errorf("paused sandbox with a node-local image = %+v, want it failed with the node's reason", l)
	}
	if sh := get(t, s, shared.ID); sh.State != sandbox.StatePaused || sh.Image != shared.Image || sh.Node != "quiet" {
		t.Errorf("paused sandbox with a shared image = %+v, want it paused on its node, image kept", sh)
	}
	// Movers racing to two nodes: exactly one moves it.
	var moved []string
	for _, to := range []string{"chatty", "other"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := s.MoveSandbox(ctx(t), string(shared.ID), "quiet", to)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				moved = append(moved, to)
			case !errors.Is(err, errdefs.ErrFailedPrecondition):
				t.Errorf("MoveSandbox to %s: %v, want success or failed_precondition", to, err)
			}
		}()
	}
	wg.Wait()
	if sh := get(t, s, shared.ID); len(moved) != 1 || sh.Node != moved[0] || sh.State != sandbox.StatePaused {
		t.Errorf("concurrent moves: moved to %v, record %+v; want one move, the record on its node", moved, sh)
	}
	if err := s.MoveSandbox(ctx(t), string(local.ID), "quiet", "chatty"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("MoveSandbox of a failed sandbox: %v, want failed_precondition", err)
	}
	if th := get(t, s, theirs.ID); th.State != sandbox.StateRunning {
		t.Errorf("sandbox of a live node = %+v, want it running", th)
	}
	if _, err := s.Reserve(ctx(t), cluster.Reservation{Node: "quiet", Owner: "k"}, time.Minute); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("Reserve on a lost node: %v, want unavailable", err)
	}
	if revived, err := s.Heartbeat(ctx(t), node("quiet", 10)); err != nil || !revived {
		t.Fatalf("Heartbeat of a lost node = %v, %v; want revived", revived, err)
	}
	heartbeat(t, s, node("quiet", 10)) // revived once
	if n := nodes(t, s)["quiet"]; n.State != cluster.NodeLive || n.Reason != "" {
		t.Errorf("after a new heartbeat: %+v, want live again", n)
	}
}

// testNodeReserve: reservations from many concurrent fronts never take a
// node past its slots (sandboxes that have not ended count too); a
// release frees a slot; an expired reservation counts no more.
func testNodeReserve(t *testing.T, s store.Backend) {
	heartbeat(t, s, node("small", 5))
	sb := record("reserved0001", base)
	sb.Node = "small"
	put(t, s, sb)
	if _, err := s.Reserve(ctx(t), cluster.Reservation{Node: "nowhere", Owner: "k"}, time.Minute); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Reserve on an unknown node: %v, want not found", err)
	}
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		ok, full int
		got      []string
	)
	for range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id, err := s.Reserve(ctx(t), cluster.Reservation{Node: "small", Owner: "k"}, time.Minute)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
				got = append(got, id)
			case errors.Is(err, errdefs.ErrResourceExhausted):
				full++
			default:
				t.Errorf("Reserve: %v", err)
			}
		}()
	}
	wg.Wait()
	if ok != 4 || full != 8 {
		t.Fatalf("12 concurrent reservations on 5 slots with 1 used: %d admitted, %d refused; want 4 and 8", ok, full)
	}
	if n := nodes(t, s)["small"]; n.Reserved != 4 || n.Sandboxes != 1 {
		t.Errorf("load = %d sandboxes + %d reserved, want 1 + 4", n.Sandboxes, n.Reserved)
	}
	if err := s.Release(ctx(t), got[0]); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx(t), got[0]); err != nil {
		t.Errorf("releasing twice: %v", err)
	}
	short, err := s.Reserve(ctx(t), cluster.Reservation{Node: "small", Owner: "k"}, 10*time.Millisecond)
	if err != nil {
		t.Fatalf("Reserve after a release: %v", err)
	}
	_ = short
	if _, err := s.Reserve(ctx(t), cluster.Reservation{Node: "small", Owner: "k"}, time.Minute); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("Reserve on a full node: %v, want resource exhausted", err)
	}
	time.Sleep(30 * time.Millisecond)
	if _, err := s.Reserve(ctx(t), cluster.Reservation{Node: "small", Owner: "k"}, time.Minute); err != nil {
		t.Errorf("Reserve once a reservation expired: %v", err)
	}
}

// testNodeQuota: reservations hold an owner to its quota across every
// node (its sandboxes that have not ended anywhere plus its live
// reservations), count by count and by memory, under concurrency; other
// owners and ended sandboxes do not count; a new record replaces one
// reservation; no quota is no limit.
func testNodeQuota(t *testing.T, s store.Backend) {
	heartbeat(t, s, node("big-1", 100), node("big-2", 100))
	mine := record("quotamine001", base)
	mine.Node, mine.Owner = "big-1", "q"
	ended := record("quotaended01", base)
	ended.Node, ended.Owner, ended.State = "big-2", "q", sandbox.StateStopped
	theirs := record("quotatheirs1", base)
	theirs.Node, theirs.Owner = "big-2", "other"
	put(t, s, mine, ended, theirs)

	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		ok, over int
	)
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := cluster.Reservation{Node: []string{"big-1", "big-2"}[i%2], Owner: "q", MemoryBytes: 1 << 20, MaxSandboxes: 4}
			_, err := s.Reserve(ctx(t), r, time.Minute)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
			case errors.Is(err, errdefs.ErrResourceExhausted) && strings.Contains(err.Error(), "across the cluster"):
				over++
			default:
				t.Errorf("Reserve: %v", err)
			}
		}()
	}
	wg.Wait()
	if ok != 3 || over != 7 {
		t.Errorf("10 concurrent reservations on two nodes for an owner with 1 of 4 sandboxes: %d admitted, %d refused; want 3 and 7", ok, over)
	}
	// By memory: 512 MiB held, 1 GiB allowed, 200 MiB each: two more.
	mem := cluster.Reservation{Node: "big-2", Owner: "q", MemoryBytes: 200 << 20, MaxMemoryBytes: 1 << 30}
	mine2 := record("quotamine002", base)
	mine2.Node, mine2.Owner = "big-1", "m"
	put(t, s, mine2)
	mem.Owner = "m"
	for i, want := range []error{nil, nil, errdefs.ErrResourceExhausted} {
		if _, err := s.Reserve(ctx(t), mem, time.Minute); !errors.Is(err, want) || (want == nil) != (err == nil) {
			t.Errorf("memory reservation %d: %v, want %v", i+1, err, want)
		}
	}
	// A new record takes the place of one reservation of its owner on its
	// node (the create it admitted): counted once; updates take none.
	c := cluster.Reservation{Node: "big-1", Owner: "c", MaxSandboxes: 2}
	for i, want := range []error{nil, nil, errdefs.ErrResourceExhausted} {
		if _, err := s.Reserve(ctx(t), c, time.Minute); !errors.Is(err, want) || (want == nil) != (err == nil) {
			t.Fatalf("reservation %d of c: %v, want %v", i+1, err, want)
		}
	}
	before := nodes(t, s)["big-1"]
	gone := record("quotagone001", base)
	gone.Node, gone.Owner, gone.State = "big-1", "c", sandbox.StateFailed
	put(t, s, gone) // an ended record (a fork that failed) takes none
	if n := nodes(t, s)["big-1"]; n.Reserved != before.Reserved {
		t.Errorf("big-1 holds %d reservations after an ended record, want %d still", n.Reserved, before.Reserved)
	}
	made := record("quotamade001", base)
	made.Node, made.Owner, made.State = "big-1", "c", sandbox.StateCreating
	put(t, s, made)
	made.State = sandbox.StateRunning
	put(t, s, made)
	after := nodes(t, s)["big-1"]
	if after.Reserved != before.Reserved-1 || after.Sandboxes != before.Sandboxes+1 {
		t.Errorf("big-1 after c's record: %d sandboxes + %d reserved, want %d + %d",
			after.Sandboxes, after.Reserved, before.Sandboxes+1, before.Reserved-1)
	}
	if _, err := s.Reserve(ctx(t), c, time.Minute); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("c at its quota (a record and a reservation): %v, want resource exhausted", err)
	}
	made.State = sandbox.StateStopped
	put(t, s, made)
	if _, err := s.Reserve(ctx(t), c, time.Minute); err != nil {
		t.Errorf("c once its sandbox ended: %v", err)
	}
	// No quota: no limit.
	for range 5 {
		if _, err := s.Reserve(ctx(t), cluster.Reservation{Node: "big-1", Owner: "q"}, time.Minute); err != nil {
			t.Errorf("a reservation without a quota: %v", err)
		}
	}
}
