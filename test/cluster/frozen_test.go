package cluster_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/client"
	"github.com/kiln-sh/kiln/internal/config"
)

// TestFrozenNode: a node that accepts connections but never answers (a
// stopped process, as in a partition) fails requests about its sandboxes
// within a few seconds with a 503 naming it — the one in flight when it
// froze as well as new ones — instead of holding them until the client
// gives up; the other node's sandboxes, a long command on it included,
// and creates are unaffected; once it runs again everything works. Nodes
// are marked lost only after 30 missed heartbeats here, so the freeze is
// seen by the fast path alone.
func TestFrozenNode(t *testing.T) {
	began := time.Now()
	w := newWorld(t)
	slow := "KILN_NODE_LOST_AFTER=30"
	front := w.firstFront("front-1", slow)
	nodeA, nodeB := w.start("node-a", config.RoleNode, "", slow), w.start("node-b", config.RoleNode, "", slow)
	w.ready(nodeA)
	w.ready(nodeB)
	w.waitLive("node-a", "node-b")
	f := client.New(front.URL, w.key)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	on := map[string]string{} // node → a sandbox of it
	for i := 0; len(on) < 2; i++ {
		if i == 12 {
			t.Fatalf("12 creates did not reach both nodes: %v", on)
		}
		sb, err := f.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "base", Runtime: "runc", Timeout: 600})
		if err != nil {
			t.Fatal(err)
		}
		if n := w.nodeOf(sb.ID); on[n] == "" {
			on[n] = sb.ID
		}
	}
	echo := func(ctx context.Context, id string) error {
		out, err := f.Output(ctx, id, api.CommandRequest{Cmd: "echo hi"})
		if err == nil && out.Stdout != "hi\n" {
			err = errors.New("the command said " + out.Stdout)
		}
		return err
	}
	for _, id := range on {
		if err := echo(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("cluster up at %v", time.Since(began).Round(time.Millisecond))

	// A long command on node-b, through the freeze: it must not be cut.
	long := make(chan error, 1)
	go func() {
		out, err := f.Output(ctx, on["node-b"], api.CommandRequest{Cmd: "sleep 6; echo long"})
		if err == nil && out.Stdout != "long\n" {
			err = errors.New("the long command said " + out.Stdout)
		}
		long <- err
	}()

	w.freeze(nodeA)
	frozenAt := time.Now()
	stopped := true
	defer func() {
		if stopped {
			_ = nodeA.Cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	// unavailable checks err is a 503 naming node-a that came within the
	// client's patience (a 20 s deadline: failing at it would be waiting
	// until the client gives up).
	unavailable := func(what string, err error) {
		t.Helper()
		var ce *client.Error
		if !errors.As(err, &ce) || ce.Status != http.StatusServiceUnavailable || !strings.Contains(ce.Message, "node-a") {
			t.Errorf("%s on frozen node-a: %v; want 503 naming node-a", what, err)
		}
	}
	rctx, rcancel := context.WithTimeout(ctx, 20*time.Second)
	start := time.Now()
	err := echo(rctx, on["node-a"])
	rcancel()
	unavailable("a command in flight", err)
	t.Logf("a command sent as node-a froze: %v after the freeze: %v", time.Since(start).Round(time.Millisecond), err)
	rctx, rcancel = context.WithTimeout(ctx, 20*time.Second)
	start = time.Now()
	err = echo(rctx, on["node-a"])
	rcancel()
	unavailable("a new command", err)
	t.Logf("a new command on frozen node-a: failed in %v: %v", time.Since(start).Round(time.Millisecond), err)
	if err := echo(ctx, on["node-b"]); err != nil {
		t.Errorf("a command on node-b while node-a is frozen: %v", err)
	}
	start = time.Now()
	sb, err := f.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "base", Runtime: "runc"})
	if err != nil {
		t.Errorf("a create while node-a is frozen: %v", err)
	} else {
		if n := w.nodeOf(sb.ID); n != "node-b" {
			t.Errorf("sandbox %s created while node-a is frozen placed on %s, want node-b", sb.ID, n)
		}
		t.Logf("a create while node-a is frozen: on node-b in %v", time.Since(start).Round(time.Millisecond))
	}
	if err := <-long; err != nil {
		t.Errorf("a 6 s command on node-b through the front during the freeze: %v", err)
	}

	_ = nodeA.Cmd.Process.Signal(syscall.SIGCONT)
	stopped = false
	t.Logf("node-a thawed %v after the freeze", time.Since(frozenAt).Round(time.Millisecond))
	thawed := time.Now()
	for {
		err := echo(ctx, on["node-a"])
		if err == nil {
			break
		}
		if time.Since(thawed) > 15*time.Second {
			t.Fatalf("node-a's sandbox 15 s after the thaw: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("node-a's sandbox answers again %v after the thaw", time.Since(thawed).Round(time.Millisecond))
	for node, id := range on {
		if got, err := f.GetSandbox(ctx, id); err != nil || got.State != "running" {
			t.Errorf("%s's sandbox %s after the thaw: %+v, %v; want running", node, id, got, err)
		}
	}
	t.Logf("TestFrozenNode took %v", time.Since(began).Round(time.Millisecond))
}
