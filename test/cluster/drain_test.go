package cluster_test

import (
	"context"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/client"
	"github.com/kiln-sh/kiln/internal/cluster"
	"github.com/kiln-sh/kiln/internal/config"
)

// TestDrain: a node that gets SIGTERM drains (docs/cluster.md): the
// registry shows it draining, creates go to the other node, its sandbox
// still answers through the front; once its last sandbox is killed it
// exits, well before its drain timeout; started again on its data dir it
// is live again.
func TestDrain(t *testing.T) {
	began := time.Now()
	w := newWorld(t)
	front := w.firstFront("front-1")
	// node-a alone first, so that the first sandbox is its.
	const timeout = 60 * time.Second
	nodeA := w.start("node-a", config.RoleNode, "", "KILN_DRAIN_TIMEOUT="+timeout.String())
	w.ready(nodeA)
	w.waitLive("node-a")
	f := client.New(front.URL, w.key)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	sb, err := f.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "base", Runtime: "runc", Timeout: 600})
	if err != nil {
		t.Fatal(err)
	}
	nodeB := w.start("node-b", config.RoleNode, "")
	w.ready(nodeB)
	w.waitLive("node-b")
	t.Logf("cluster up at %v", time.Since(began).Round(time.Millisecond))

	termAt := time.Now()
	if err := nodeA.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if stateOf(t, f, "node-a") == cluster.NodeDraining {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node-a not draining in GET /v1/nodes 10 s after SIGTERM: %q", stateOf(t, f, "node-a"))
		}
	}
	t.Logf("node-a draining in the registry %v after SIGTERM", time.Since(termAt).Round(time.Millisecond))

	for i := range 3 {
		more, err := f.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "base", Runtime: "runc"})
		if err != nil {
			t.Fatalf("create %d while node-a drains: %v", i, err)
		}
		if n := w.nodeOf(more.ID); n != "node-b" {
			t.Errorf("sandbox %s created while node-a drains placed on %s, want node-b", more.ID, n)
		}
		if err := f.KillSandbox(ctx, more.ID); err != nil {
			t.Errorf("killing %s: %v", more.ID, err)
		}
	}
	out, err := f.Output(ctx, sb.ID, api.CommandRequest{Cmd: "echo still-$KILN_SANDBOX_ID"})
	if err != nil || out.Stdout != "still-"+sb.ID+"\n" {
		t.Errorf("a command on node-a's sandbox while it drains: %+v, %v", out, err)
	}
	select {
	case <-nodeA.Exited:
		t.Fatalf("node-a exited with a sandbox left, %v after SIGTERM (drain timeout %v)", time.Since(termAt), timeout)
	default:
	}
	// Seen through the front, again, after a heartbeat or two: still
	// draining, not lost.
	time.Sleep(2 * heartbeat)
	if st := stateOf(t, f, "node-a"); st != cluster.NodeDraining {
		t.Errorf("node-a %v after SIGTERM: %q, want still draining", time.Since(termAt).Round(time.Millisecond), st)
	}

	killedAt := time.Now()
	if err := f.KillSandbox(ctx, sb.ID); err != nil {
		t.Fatalf("killing node-a's sandbox: %v", err)
	}
	select {
	case <-nodeA.Exited:
	case <-time.After(timeout):
		t.Fatalf("node-a did not exit within its drain timeout once its last sandbox ended")
	}
	t.Logf("node-a exited %v after its last sandbox was killed, %v after SIGTERM (drain timeout %v)",
		time.Since(killedAt).Round(time.Millisecond), time.Since(termAt).Round(time.Millisecond), timeout)
	if code := nodeA.Cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("node-a exited with status %d, want 0", code)
	}

	back := w.start("node-a", config.RoleNode, dataDirOf(nodeA))
	w.ready(back)
	w.waitLive("node-a")
	if st := stateOf(t, f, "node-a"); st != cluster.NodeLive {
		t.Errorf("node-a restarted: %q, want live", st)
	}
	t.Logf("TestDrain took %v", time.Since(began).Round(time.Millisecond))
}

// stateOf is node's state in GET /v1/nodes through front f.
func stateOf(t *testing.T, f *client.Client, node string) string {
	t.Helper()
	ns, err := f.Nodes(t.Context())
	if err != nil {
		t.Fatalf("GET /v1/nodes: %v", err)
	}
	for _, n := range ns {
		if n.Name == node {
			return n.State
		}
	}
	return ""
}

// dataDirOf is p's --data-dir.
func dataDirOf(p *proc) string { return p.Cmd.Args[slices.Index(p.Cmd.Args, "--data-dir")+1] }
