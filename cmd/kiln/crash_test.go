package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/client"
	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/oci/ocitest"
	"github.com/kiln-sh/kiln/internal/servetest"
	"github.com/kiln-sh/kiln/internal/template"
)

// startServe starts `kiln serve` on dataDir, its sandbox networking in
// t's test world (the same on a restart), and waits until it answers.
func startServe(t *testing.T, kiln, dataDir, addr string) *servetest.Proc {
	t.Helper()
	p := servetest.StartProc(t, kiln, "kiln serve", dataDir, addr, servetest.NetEnv(t))
	p.Ready(t, "")
	return p
}

// requireTemplate needs root and the built-in template name (make setup);
// under CI=true it fails rather than skips.
func requireTemplate(t testing.TB, name string) {
	t.Helper()
	ocitest.RequireRoot(t)
	_, err := template.Lookup(config.FromEnv().DataDir, name)
	ocitest.Require(t, err == nil, fmt.Sprintf("%s template not built (make setup): %v", name, err))
}

// TestServeSurvivesKill9 kills kiln serve with SIGKILL in the middle of
// creates and commands and starts it again on the same data dir: every
// sandbox acknowledged before the crash is either running and usable, with
// its processes and files, or failed with a reason; nothing is leaked.
func TestServeSurvivesKill9(t *testing.T) {
	requireTemplate(t, "base")
	kiln := buildKiln(t)
	dataDir := servetest.DataDir(t)
	addr := servetest.FreeAddr(t)
	srv := startServe(t, kiln, dataDir, addr)
	key := srv.AdminKey(t)
	c := client.New("http://"+addr, key)
	ctx := context.Background()

	// Settled sandboxes with state the restart must keep.
	type settled struct {
		id, runtime string
		pid         int
	}
	var keep []settled
	for _, rt := range []string{"runsc", "runc"} {
		sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Runtime: rt, Timeout: 600})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.WriteFile(ctx, sb.ID, "state.txt", strings.NewReader("kept")); err != nil {
			t.Fatal(err)
		}
		pid, err := c.Start(ctx, sb.ID, api.CommandRequest{Cmd: "for i in $(seq 1 60); do echo tick $i; sleep 0.1; done", Timeout: 120})
		if err != nil {
			t.Fatal(err)
		}
		keep = append(keep, settled{sb.ID, rt, pid})
	}

	// Chaos: creates and commands in flight when the server dies.
	cctx, cancel := context.WithCancel(ctx)
	var mu sync.Mutex
	var acked []string
	ackedFiles := map[string]bool{} // sandboxes whose chaos.txt upload was acknowledged
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			rt := []string{"runc", "runsc"}[i%2]
			for cctx.Err() == nil {
				sb, err := c.CreateSandbox(cctx, api.CreateSandboxRequest{Runtime: rt, Timeout: 600})
				if err != nil {
					return
				}
				mu.Lock()
				acked = append(acked, sb.ID)
				mu.Unlock()
				// An acknowledged upload must survive the crash with its sandbox.
				if _, err := c.WriteFile(cctx, sb.ID, "chaos.txt", strings.NewReader(sb.ID)); err == nil {
					mu.Lock()
					ackedFiles[sb.ID] = true
					mu.Unlock()
				}
				c.Run(cctx, sb.ID, api.CommandRequest{Cmd: "echo hi; sleep 0.2; echo bye"}, client.RunOptions{})
			}
		})
	}
	time.Sleep(1500 * time.Millisecond)
	srv.Cmd.Process.Signal(syscall.SIGKILL)
	srv.Stop(t)
	cancel()
	wg.Wait()
	t.Logf("killed the server with %d sandboxes and %d uploads acknowledged during the chaos", len(acked), len(ackedFiles))

	srv = startServe(t, kiln, dataDir, addr)
	defer srv.Stop(t)

	live := map[string]bool{}
	for _, k := range keep {
		sb, err := c.GetSandbox(ctx, k.id)
		if err != nil || sb.State != "running" {
			t.Fatalf("settled %s sandbox after restart: %+v, %v", k.runtime, sb, err)
		}
		var got bytes.Buffer
		if _, err := c.ReadFile(ctx, k.id, "state.txt", &got); err != nil || got.String() != "kept" {
			t.Errorf("file after restart: %q, %v", got.String(), err)
		}
		var out strings.Builder
		res, err := c.Attach(ctx, k.id, k.pid, 0, client.RunOptions{OnStdout: func(b []byte) { out.Write(b) }})
		if err != nil || res.Exit.Code != 0 || !strings.Contains(out.String(), "tick 60\n") {
			t.Errorf("background command across the crash: exit %+v, err %v, output tail %q", res.Exit, err, tail(out.String()))
		}
		live[k.id] = true
	}
	for _, id := range acked {
		sb, err := c.GetSandbox(ctx, id)
		if err != nil {
			t.Errorf("acknowledged sandbox %s lost: %v", id, err)
			continue
		}
		switch sb.State {
		case "running":
			r, err := c.Output(ctx, id, api.CommandRequest{Cmd: "echo ok"})
			if err != nil || r.Stdout != "ok\n" {
				t.Errorf("re-adopted sandbox %s unusable: %+v, %v", id, r, err)
			}
			if ackedFiles[id] {
				var got bytes.Buffer
				if _, err := c.ReadFile(ctx, id, "chaos.txt", &got); err != nil || got.String() != id {
					t.Errorf("acknowledged upload in %s lost across the crash: %q, %v", id, got.String(), err)
				}
			}
			live[id] = true
		case "failed":
			if sb.Reason == "" {
				t.Errorf("sandbox %s failed without a reason", id)
			}
		default:
			t.Errorf("sandbox %s is %s after restart", id, sb.State)
		}
	}

	// A create whose reply the crash cut off may have made its sandbox:
	// the server lists it, and it must work like an acknowledged one.
	l, err := c.ListSandboxes(ctx, client.ListFilter{States: []string{"running"}, Limit: 100})
	if err != nil {
		t.Fatalf("listing sandboxes after restart: %v", err)
	}
	for _, sb := range l.Sandboxes {
		if live[sb.ID] {
			continue
		}
		r, err := c.Output(ctx, sb.ID, api.CommandRequest{Cmd: "echo ok"})
		if err != nil || r.Stdout != "ok\n" {
			t.Errorf("sandbox %s, created unacknowledged, unusable: %+v, %v", sb.ID, r, err)
		}
		t.Logf("sandbox %s: created, its reply lost in the crash, running after it", sb.ID)
		live[sb.ID] = true
	}

	// Nothing leaked: the only sandbox dirs, mounts and containers left are
	// those of running sandboxes.
	dirs, _ := os.ReadDir(filepath.Join(dataDir, "sandboxes"))
	for _, d := range dirs {
		if !live[d.Name()] {
			t.Errorf("leaked sandbox dir %s", d.Name())
		}
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	for _, l := range strings.Split(string(mounts), "\n") {
		if i := strings.Index(l, filepath.Join(dataDir, "sandboxes")+"/"); i >= 0 {
			id := strings.SplitN(l[i+len(dataDir)+len("/sandboxes/"):], "/", 2)[0]
			if !live[id] {
				t.Errorf("leaked mount: %s", l)
			}
		}
	}
	for _, rt := range []string{"runsc", "runc"} {
		// --quiet: runsc's flags have no -q (runc's have both).
		out, err := exec.Command(map[string]string{"runsc": config.Default().RunscPath, "runc": "runc"}[rt],
			"--root", filepath.Join("/run/kiln", rt), "list", "--quiet").Output()
		if err != nil {
			t.Errorf("listing %s containers: %v", rt, err)
		}
		for _, id := range strings.Fields(string(out)) {
			if _, err := c.GetSandbox(ctx, id); err == nil && !live[id] {
				t.Errorf("leaked %s container %s", rt, id)
			}
		}
	}
	for id := range live {
		if err := c.KillSandbox(ctx, id); err != nil {
			t.Errorf("killing %s: %v", id, err)
		}
	}
}

func tail(s string) string {
	if len(s) > 200 {
		return s[len(s)-200:]
	}
	return s
}
