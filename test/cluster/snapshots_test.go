package cluster_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/client"
	"github.com/kiln-sh/kiln/internal/cluster"
	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/servetest"
)

// TestSnapshotsAcrossNodes: two runsc nodes share a snapshot dir (a temp
// dir standing for NFS), a third keeps its images to itself. A paused
// sandbox resumes on its node through either front, with its files and
// its processes' memory; once its node is killed and marked lost it stays
// paused (the node-local one fails with the lost reason), and a resume
// through a front brings it up on the other node, from the shared dir,
// exactly once for two fronts resuming it at once; a create from a named
// snapshot of the lost node lands on the other node; the killed node,
// restarted, drops its copy of the moved sandbox.
func TestSnapshotsAcrossNodes(t *testing.T) {
	began := time.Now()
	w := newWorld(t)
	shared := t.TempDir()
	front1 := w.firstFront("front-1")
	key := w.key
	front2 := w.start("front-2", config.RoleFront, "")
	withShared := []string{"KILN_RUNTIME=runsc", "KILN_SNAPSHOT_DIR=" + shared}
	dirs := map[string]string{"node-a": servetest.DataDir(t), "node-b": servetest.DataDir(t), "node-c": servetest.DataDir(t)}
	procs := map[string]*proc{
		"node-a": w.start("node-a", config.RoleNode, dirs["node-a"], withShared...),
		"node-b": w.start("node-b", config.RoleNode, dirs["node-b"], withShared...),
		// No shared dir; one slot, which the test fills directly, so
		// fronts place nothing there.
		"node-c": w.start("node-c", config.RoleNode, dirs["node-c"], "KILN_RUNTIME=runsc", "KILN_NODE_SLOTS=1"),
	}
	for _, p := range []*proc{front2, procs["node-a"], procs["node-b"], procs["node-c"]} {
		w.ready(p)
	}
	w.waitLive("node-a", "node-b", "node-c")
	t.Logf("cluster up at %v", time.Since(began).Round(time.Millisecond))
	fronts := []*client.Client{client.New(front1.URL, key), client.New(front2.URL, key)}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	// node-c's sandbox, made on the node itself (as a front would send it).
	direct := client.New(procs["node-c"].URL, key, client.WithHTTPClient(&http.Client{Transport: tokenTransport{w.token}}))
	local, err := direct.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "base", Runtime: "runsc"})
	if err != nil {
		t.Fatalf("creating on node-c: %v", err)
	}

	sb, err := fronts[0].CreateSandbox(ctx, api.CreateSandboxRequest{Template: "base", Runtime: "runsc", Timeout: 600})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	origin := w.nodeOf(id)
	other := map[string]string{"node-a": "node-b", "node-b": "node-a"}[origin]
	if other == "" {
		t.Fatalf("the sandbox went to %s, want node-a or node-b (node-c is full)", origin)
	}
	t.Logf("sandbox %s on %s", id, origin)

	// State: a file on its disk, and a shell loop whose variable (memory
	// only) it keeps writing to a file; a restore with its memory finds
	// the loop still writing the same value.
	note := "written on " + origin
	if _, err := fronts[0].WriteFile(ctx, id, "/home/user/note.txt", strings.NewReader(note)); err != nil {
		t.Fatal(err)
	}
	loop := `nohup sh -c 'v=$(head -c 8 /dev/urandom | od -An -tx1 | tr -d " \n"); echo $v > /home/user/v.txt;
		while :; do echo $v > /tmp/beat.new && mv /tmp/beat.new /tmp/beat; sleep 0.1; done' >/dev/null 2>&1 &`
	if _, err := fronts[0].Output(ctx, id, api.CommandRequest{Cmd: loop}); err != nil {
		t.Fatalf("starting the loop: %v", err)
	}
	waitFile(ctx, t, fronts[0], id, "/home/user/v.txt")
	waitFile(ctx, t, fronts[0], id, "/tmp/beat")
	secret := readFile(ctx, t, fronts[0], id, "/home/user/v.txt")
	// check asserts the state of the sandbox through front f.
	check := func(t *testing.T, f *client.Client, id string) {
		t.Helper()
		if got := readFile(ctx, t, f, id, "/home/user/note.txt"); got != note {
			t.Errorf("note = %q, want %q", got, note)
		}
		if _, err := f.Output(ctx, id, api.CommandRequest{Cmd: "rm -f /tmp/beat"}); err != nil {
			t.Fatal(err)
		}
		waitFile(ctx, t, f, id, "/tmp/beat")
		if got := readFile(ctx, t, f, id, "/tmp/beat"); got != secret {
			t.Errorf("the loop writes %q, want %q: its memory did not survive", got, secret)
		}
	}
	if _, err := fronts[0].CreateSnapshot(ctx, id, "before-loss"); err != nil {
		t.Fatalf("snapshot: %v", err)
	}

	t.Run("pause and resume on the origin node through either front", func(t *testing.T) {
		start := time.Now()
		if p, err := fronts[0].Pause(ctx, id); err != nil || p.State != "paused" {
			t.Fatalf("pause = %+v, %v", p, err)
		}
		paused := time.Since(start)
		rec := record(t, w, id)
		if rec.Image == "" || !strings.HasPrefix(rec.Image, "paused/"+id+".") {
			t.Fatalf("paused record's image = %q, want one in the shared dir", rec.Image)
		}
		start = time.Now()
		if r, err := fronts[1].Resume(ctx, id); err != nil || r.State != "running" {
			t.Fatalf("resume = %+v, %v", r, err)
		}
		t.Logf("pause with the shared dir %v, resume on its node %v", paused.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
		if n := w.nodeOf(id); n != origin {
			t.Errorf("resumed on %s, want its node %s", n, origin)
		}
		if rec := record(t, w, id); rec.Image != "" {
			t.Errorf("a running sandbox's record names image %q", rec.Image)
		}
		check(t, fronts[1], id)
	})

	if _, err := fronts[1].Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	// A second paused sandbox on the origin, to be killed once it is lost.
	onOrigin := client.New(procs[origin].URL, key, client.WithHTTPClient(&http.Client{Transport: tokenTransport{w.token}}))
	doomed, err := onOrigin.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "base", Runtime: "runsc"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fronts[1].Pause(ctx, doomed.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := fronts[0].Pause(ctx, local.ID); err != nil {
		t.Fatalf("pausing node-c's sandbox: %v", err)
	}
	killed := time.Now()
	w.kill9(procs[origin])
	w.kill9(procs["node-c"])
	restarted := false
	t.Cleanup(func() {
		// Their leftovers (mounted layers of paused sandboxes) go at
		// their next start.
		if !restarted {
			for _, n := range []string{origin, "node-c"} {
				w.ready(w.start(n, config.RoleNode, dirs[n], withShared...))
			}
		}
	})
	waitLost(ctx, t, w, origin, "node-c")
	t.Logf("both nodes lost %v after the kill", time.Since(killed).Round(time.Millisecond))

	t.Run("a lost node's paused sandbox stays paused with a shared image, fails without", func(t *testing.T) {
		if rec := record(t, w, id); rec.State != sandbox.StatePaused || rec.Image == "" || rec.Node != origin {
			t.Errorf("shared paused sandbox after its node's loss = %s on %s (image %q, reason %q), want paused there",
				rec.State, rec.Node, rec.Image, rec.Reason)
		}
		rec := record(t, w, local.ID)
		if rec.State != sandbox.StateFailed || !strings.Contains(rec.Reason, "node node-c lost") {
			t.Errorf("node-local paused sandbox after its node's loss = %s (%q), want failed with the lost reason", rec.State, rec.Reason)
		}
		_, err := fronts[1].Resume(ctx, local.ID)
		var ce *client.Error
		if !errors.As(err, &ce) || ce.Status != http.StatusConflict || !strings.Contains(ce.Message, "lost") {
			t.Errorf("resuming the node-local one: %v, want 409 naming the loss", err)
		}
	})

	t.Run("two fronts resume it at once: once, on the other node", func(t *testing.T) {
		image := imageOf(t, w, id)
		var (
			wg   sync.WaitGroup
			errs [2]error
			took [2]time.Duration
		)
		for i, f := range fronts {
			wg.Go(func() {
				start := time.Now()
				_, errs[i] = f.Resume(ctx, id)
				took[i] = time.Since(start)
			})
		}
		wg.Wait()
		ok := 0
		for i, err := range errs {
			var ce *client.Error
			switch {
			case err == nil:
				ok++
				t.Logf("resume elsewhere through front-%d: %v", i+1, took[i].Round(time.Millisecond))
			case errors.As(err, &ce) && ce.Status == http.StatusConflict:
				t.Logf("the other resume: %v (after %v)", err, took[i].Round(time.Millisecond))
			default:
				t.Errorf("resume through front-%d: %v, want success or 409", i+1, err)
			}
		}
		if ok != 1 {
			t.Fatalf("%d resumes succeeded, want exactly 1", ok)
		}
		rec := record(t, w, id)
		if rec.State != sandbox.StateRunning || rec.Node != other || rec.Image != "" {
			t.Fatalf("after the resume: %s on %s (image %q), want running on %s", rec.State, rec.Node, rec.Image, other)
		}
		check(t, fronts[0], id)
		check(t, fronts[1], id)
		waitGone(t, filepath.Join(shared, strings.SplitN(image, "@", 2)[0]))
	})

	t.Run("a kill of a lost node's paused sandbox ends it and its image", func(t *testing.T) {
		image := imageOf(t, w, doomed.ID)
		if err := fronts[0].KillSandbox(ctx, doomed.ID); err != nil {
			t.Fatalf("kill: %v", err)
		}
		if rec := record(t, w, doomed.ID); rec.State != sandbox.StateStopped {
			t.Errorf("after the kill: %s (%q), want stopped", rec.State, rec.Reason)
		}
		waitGone(t, filepath.Join(shared, strings.SplitN(image, "@", 2)[0]))
	})

	t.Run("a create from the lost node's snapshot lands on the other node", func(t *testing.T) {
		start := time.Now()
		c, err := fronts[1].CreateSandbox(ctx, api.CreateSandboxRequest{Snapshot: "before-loss"})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("create from the shared snapshot on another node: %v", time.Since(start).Round(time.Millisecond))
		if n := w.nodeOf(c.ID); n != other {
			t.Errorf("made on %s, want %s", n, other)
		}
		if got := readFile(ctx, t, fronts[0], c.ID, "/home/user/note.txt"); got != note {
			t.Errorf("its note = %q, want %q", got, note)
		}
		if err := fronts[0].KillSandbox(ctx, c.ID); err != nil {
			t.Error(err)
		}
	})

	t.Run("the lost node, restarted, drops its copy", func(t *testing.T) {
		restarted = true
		for _, n := range []string{origin, "node-c"} {
			env := withShared
			if n == "node-c" {
				env = []string{"KILN_RUNTIME=runsc", "KILN_NODE_SLOTS=1"}
			}
			w.ready(w.start(n, config.RoleNode, dirs[n], env...))
		}
		if _, err := os.Stat(filepath.Join(dirs[origin], "sandboxes", id)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still has the moved sandbox's dir (%v)", origin, err)
		}
		if _, err := os.Stat(filepath.Join(dirs["node-c"], "sandboxes", local.ID)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("node-c still has its lost sandbox's dir (%v)", err)
		}
		if rec := record(t, w, id); rec.Node != other || rec.State != sandbox.StateRunning {
			t.Errorf("after %s's restart the sandbox is %s on %s, want running on %s", origin, rec.State, rec.Node, other)
		}
		if err := fronts[0].KillSandbox(ctx, id); err != nil {
			t.Error(err)
		}
	})
	t.Logf("TestSnapshotsAcrossNodes took %v", time.Since(began).Round(time.Millisecond))
}

// record is the catalog's record of sandbox id.
func record(t *testing.T, w *world, id string) sandbox.Sandbox {
	t.Helper()
	rec, err := w.catalog.GetSandbox(t.Context(), sandbox.ID(id))
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// imageOf is the shared image the catalog's record of id names.
func imageOf(t *testing.T, w *world, id string) string {
	t.Helper()
	rec := record(t, w, id)
	if rec.Image == "" {
		t.Fatalf("sandbox %s (%s) has no shared image", id, rec.State)
	}
	return rec.Image
}

// waitGone waits until a shared image's dir, removed in the background,
// is gone.
func waitGone(t *testing.T, dir string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for _, err := os.Stat(dir); err == nil && time.Now().Before(deadline); _, err = os.Stat(dir) {
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("image %s is still there: %v", dir, err)
	}
}

// readFile reads a file of sandbox id through f.
func readFile(ctx context.Context, t *testing.T, f *client.Client, id, path string) string {
	t.Helper()
	var b bytes.Buffer
	if _, err := f.ReadFile(ctx, id, path, &b); err != nil {
		t.Fatalf("reading %s: %v", path, err)
	}
	return strings.TrimSpace(b.String())
}

// waitFile waits until a file of sandbox id is there and not empty.
func waitFile(ctx context.Context, t *testing.T, f *client.Client, id, path string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, err := f.Output(ctx, id, api.CommandRequest{Cmd: fmt.Sprintf("test -s %s && echo yes", path)})
		if err == nil && strings.TrimSpace(out.Stdout) == "yes" {
			return
		}
		if time.Now().After(deadline) {
			ps, _ := f.Output(ctx, id, api.CommandRequest{Cmd: "ps -ef; ls -la /tmp"})
			t.Fatalf("%s did not appear: %v; %+v", path, err, ps)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitLost waits until the catalog marks the nodes lost.
func waitLost(ctx context.Context, t *testing.T, w *world, names ...string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ns, err := w.catalog.Nodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		lost := 0
		for _, n := range ns {
			for _, want := range names {
				if n.Name == want && n.State == cluster.NodeLost {
					lost++
				}
			}
		}
		if lost == len(names) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nodes %v not all marked lost: %+v", names, ns)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
