package cluster_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/internal/cluster"
	"github.com/kiln-sh/kiln/internal/store/sqlite"
)

// TestAnswering: on a real (SQLite) catalog, a node that stops
// heartbeating while another goes on is refused as not answering, naming
// it; when every node is quiet (the catalog is in trouble, not every
// node) none is; a lost node is refused as lost.
func TestAnswering(t *testing.T) {
	ctx := t.Context()
	st, err := sqlite.Open(ctx, sqlite.Memory)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	beat := func(names ...string) {
		t.Helper()
		for _, name := range names {
			if _, err := st.Heartbeat(ctx, cluster.Node{Name: name, URL: "http://" + name, Slots: 4, StartedAt: time.Now()}); err != nil {
				t.Fatal(err)
			}
		}
	}
	const quiet = 500 * time.Millisecond
	d := cluster.NewDirectory(st, quiet)
	answering := func(name string) error {
		t.Helper()
		n, err := d.Node(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		return d.Answering(n)
	}
	beat("a", "b")
	if err := answering("a"); err != nil {
		t.Fatalf("a just after its heartbeat: %v", err)
	}
	// A node that registers after the listing was read is found at once,
	// not a second later.
	time.Sleep(150 * time.Millisecond)
	beat("c")
	if _, err := d.Node(ctx, "c"); err != nil {
		t.Errorf("a node registered after the listing: %v", err)
	}
	// b heartbeats, a (and c) do not, for longer than the listing's
	// second.
	for end := time.Now().Add(1200 * time.Millisecond); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		beat("b")
	}
	if err := answering("a"); err == nil || !strings.Contains(err.Error(), "node a is not answering: no heartbeat for") {
		t.Errorf("a silent while b heartbeats: %v, want not answering", err)
	}
	if err := answering("b"); err != nil {
		t.Errorf("b heartbeating: %v", err)
	}
	// Nobody heartbeats: no proof against either.
	time.Sleep(1200 * time.Millisecond)
	for _, name := range []string{"a", "b", "c"} {
		if err := answering(name); err != nil {
			t.Errorf("%s while no node heartbeats: %v, want no verdict (nil)", name, err)
		}
	}
	beat("b")
	if _, err := st.MarkLost(context.Background(), time.Second); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // the listing's second
	if err := answering("a"); err == nil || !strings.Contains(err.Error(), "node a is lost") {
		t.Errorf("a marked lost: %v, want lost", err)
	}
}
