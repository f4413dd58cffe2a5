// Package reliability holds the reliability drills (runtime, agent and disk
// failures against a real Manager) and the soak (`make soak`).
package reliability

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/bench"
	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/sandbox/sandboxtest"
	"github.com/kiln-sh/kiln/internal/store/sqlite"
)

// agentPath is a kiln-agent built once for the package's tests.
var agentPath string

func TestMain(m *testing.M) { os.Exit(sandboxtest.Main(m, &agentPath)) }

// hostProcs returns the sandbox's host processes whose command line
// contains what ("" for all).
func hostProcs(id sandbox.ID, what string) []int {
	data, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory/kiln", id.String(), "cgroup.procs"))
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		var pid int
		fmt.Sscan(f, &pid)
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if bytes.Contains(cmd, []byte(what)) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// waitFailed waits until the Manager has marked the sandbox failed.
func waitFailed(t *testing.T, m *sandbox.Manager, id sandbox.ID) sandbox.Sandbox {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		sb, err := m.Get(context.Background(), id)
		if err == nil && sb.State == sandbox.StateFailed {
			return sb
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox not marked failed: %+v, %v", sb, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// assertGone fails if anything of the sandboxes is left on the host.
func assertGone(t *testing.T, cfg sandbox.Config, ids ...sandbox.ID) {
	t.Helper()
	var s []string
	for _, id := range ids {
		s = append(s, id.String())
	}
	assertGoneIDs(t, cfg, s)
}

// assertGoneIDs is assertGone of ids as strings.
func assertGoneIDs(t *testing.T, cfg sandbox.Config, s []string) {
	t.Helper()
	// A layer's loop device clears itself (autoclear) when its last mount
	// goes, and a mount namespace copied meanwhile (any sandbox starting,
	// also in other test packages) holds that mount for a moment: loop
	// devices alone get up to 15 s; anything else must be gone at once.
	deadline := time.Now().Add(15 * time.Second)
	for {
		left := bench.Leftovers(s, filepath.Dir(cfg.StateDir))
		if len(left) == 0 {
			return
		}
		onlyLoops := !slices.ContainsFunc(left, func(l string) bool { return !strings.HasPrefix(l, "loop device of ") })
		if !onlyLoops || time.Now().After(deadline) {
			t.Errorf("left behind: %v", left)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// busy starts a command streaming output and an upload on b and returns
// channels with their errors.
func busy(b *sandboxtest.Box) (cmdErr, uploadErr <-chan error) {
	ce, ue := make(chan error, 1), make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	go func() {
		_, err := b.Agent.Exec(ctx, wire.ExecParams{Cmd: "while :; do echo tick; sleep 0.01; done", TimeoutMs: 60_000}, func(api.Event) error { return nil })
		ce <- err
	}()
	go func() {
		defer cancel()
		pr, pw := io.Pipe()
		go func() {
			for i := 0; i < 6000; i++ {
				if _, err := pw.Write(bytes.Repeat([]byte("x"), 4096)); err != nil {
					return
				}
				time.Sleep(time.Millisecond)
			}
			pw.Close()
		}()
		_, err := b.Agent.WriteFile(ctx, wire.WriteParams{Path: "upload.bin"}, pr)
		pr.Close()
		ue <- err
	}()
	time.Sleep(500 * time.Millisecond) // both in flight
	return ce, ue
}

// TestKillRuntimeProcess is the shim drill. Kiln has no shim: the agent's
// FIFOs are held by the container itself, so the processes whose death
// is the analogue are runc's container init (the agent, PID 1) and
// gVisor's sentry ("runsc-sandbox boot") and gofer. Each is killed with
// SIGKILL from the host while a command streams and a file uploads: the
// calls in flight must end with an error (not hang), the sandbox must be
// marked failed with a reason, and nothing of it may be left.
func TestKillRuntimeProcess(t *testing.T) {
	cases := []struct{ runtime, process string }{
		{"runc", "kiln-agent"}, // container init
		{"runsc", "boot"},      // the sentry
		{"runsc", "gofer"},     // the file proxy
	}
	for _, c := range cases {
		t.Run(c.runtime+" "+c.process, func(t *testing.T) {
			t.Parallel()
			cfg := sandboxtest.Config(t, agentPath)
			m := sandboxtest.NewManager(t, cfg)
			b := sandboxtest.Create(t, m, sandbox.CreateOptions{Runtime: c.runtime})
			pids := hostProcs(b.SB.ID, c.process)
			if len(pids) == 0 {
				t.Fatalf("no %s process in the sandbox's cgroup", c.process)
			}
			ce, ue := busy(b)
			for _, pid := range pids {
				syscall.Kill(pid, syscall.SIGKILL)
			}
			for what, ch := range map[string]<-chan error{"command": ce, "upload": ue} {
				select {
				case err := <-ch:
					if err == nil {
						t.Errorf("%s in flight when the %s died succeeded", what, c.process)
					} else {
						t.Logf("%s in flight: %v", what, err)
					}
				case <-time.After(45 * time.Second):
					t.Fatalf("%s in flight hangs after the %s died", what, c.process)
				}
			}
			sb := waitFailed(t, m, b.SB.ID)
			if sb.Reason == "" {
				t.Error("failed without a reason")
			}
			t.Logf("sandbox failed: %s", sb.Reason)
			assertGone(t, cfg, b.SB.ID)
		})
	}
}

// TestKillAgent kills the agent (the container's init) through the
// runtime, as `runc kill`/`runsc kill` do, in the middle of work.
func TestKillAgent(t *testing.T) {
	sandboxtest.ForEachRuntime(t, func(t *testing.T, rt string) {
		cfg := sandboxtest.Config(t, agentPath)
		m := sandboxtest.NewManager(t, cfg)
		b := sandboxtest.Create(t, m, sandbox.CreateOptions{Runtime: rt})
		ce, ue := busy(b)
		bin := map[string]string{"runsc": cfg.RunscPath, "runc": cfg.RuncPath}[rt]
		if out, err := exec.Command(bin, "--root", filepath.Join(cfg.RunDir, rt), "kill", b.SB.ID.String(), "KILL").CombinedOutput(); err != nil {
			t.Fatalf("%s kill: %v: %s", rt, err, out)
		}
		for what, ch := range map[string]<-chan error{"command": ce, "upload": ue} {
			select {
			case err := <-ch:
				if err == nil {
					t.Errorf("%s in flight when the agent died succeeded", what)
				}
			case <-time.After(45 * time.Second):
				t.Fatalf("%s in flight hangs after the agent died", what)
			}
		}
		sb := waitFailed(t, m, b.SB.ID)
		t.Logf("sandbox failed: %s", sb.Reason)
		assertGone(t, cfg, b.SB.ID)
	})
}

// TestRuntimeFailures injects failing runtimes (a wrapper script as the
// runtime binary): creates fail with an error that says what failed,
// leave nothing behind, and the Manager keeps serving.
func TestRuntimeFailures(t *testing.T) {
	real, err := exec.LookPath(config.FromEnv().RuncPath)
	if err != nil {
		t.Skip("runc not installed")
	}
	// want is what the error must say: the runtime's message, or the
	// failing step when the runtime gives none.
	cases := []struct {
		name, script, want string
	}{
		{"binary fails", "echo 'runtime exploded' >&2; exit 1", "runtime exploded"},
		{"start fails", `for a; do [ "$a" = start ] && { echo 'cannot start' >&2; exit 1; }; done; exec ` + real + ` "$@"`, "runc start"},
		{"create hangs", `for a; do [ "$a" = create ] && exec sleep 600; done; exec ` + real + ` "$@"`, "runc create"},
		{"state lies", `for a; do [ "$a" = state ] && { echo '{"status":"stopped"}'; exit 0; }; done; exec ` + real + ` "$@"`, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cfg := sandboxtest.Config(t, agentPath)
			wrapper := filepath.Join(t.TempDir(), "runc")
			os.WriteFile(wrapper, []byte("#!/bin/sh\n"+c.script+"\n"), 0o755)
			cfg.RuncPath = wrapper
			m := sandboxtest.NewManager(t, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			sb, err := m.Create(ctx, sandbox.CreateOptions{Runtime: "runc"})
			if err == nil {
				if c.want != "" {
					t.Fatalf("create with a failing runtime succeeded: %+v", sb)
				}
				// A runtime that misreports state must not break a
				// working sandbox's use or its removal.
				a, _ := m.Agent(sb.ID)
				if exit, err := a.Exec(ctx, wire.ExecParams{Args: []string{"true"}}, func(api.Event) error { return nil }); err != nil || exit.Code != 0 {
					t.Errorf("exec: %+v, %v", exit, err)
				}
				if err := m.Kill(context.Background(), sb.ID); err != nil {
					t.Errorf("kill: %v", err)
				}
			} else {
				if !strings.Contains(err.Error(), c.want) {
					t.Errorf("create error %q does not say %q", err, c.want)
				}
				t.Logf("create: %v", err)
			}
			if ents, _ := os.ReadDir(cfg.StateDir); len(ents) != 0 {
				t.Errorf("state dir not empty: %v", ents)
			}
			mounts, _ := os.ReadFile("/proc/self/mountinfo")
			if bytes.Contains(mounts, []byte(cfg.StateDir)) {
				t.Errorf("mounts left under %s", cfg.StateDir)
			}
			if l := m.Live(); len(l) != 0 {
				t.Errorf("live after a failed create: %+v", l)
			}
		})
	}
}

// TestDataDiskFull runs a Manager whose data dir (store, sandbox layers)
// is a small tmpfs, fills it from the host and checks: creates fail with a
// clear error and leave nothing; a running sandbox keeps answering;
// uploads either fail or are kept; what was acknowledged before is intact;
// once space is freed everything works again.
func TestDataDiskFull(t *testing.T) {
	sandboxtest.ForEachRuntime(t, func(t *testing.T, rt string) {
		cfg := sandboxtest.Config(t, agentPath)
		data := t.TempDir()
		if err := syscall.Mount("tmpfs", data, "tmpfs", 0, "size=96m"); err != nil {
			t.Fatalf("mounting a tmpfs data dir: %v", err)
		}
		t.Cleanup(func() { syscall.Unmount(data, syscall.MNT_DETACH) })
		if err := os.Symlink(filepath.Join(cfg.DataDir, "templates"), filepath.Join(data, "templates")); err != nil {
			t.Fatal(err)
		}
		cfg.DataDir, cfg.StateDir = data, filepath.Join(data, "sandboxes")
		st, err := sqlite.Open(context.Background(), filepath.Join(data, "kiln.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		cfg.Store = st
		m := sandboxtest.NewManager(t, cfg)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()

		a := sandboxtest.Create(t, m, sandbox.CreateOptions{Runtime: rt})
		kept := bytes.Repeat([]byte("kept "), 800_000) // 4 MB
		if _, err := a.Agent.WriteFile(ctx, wire.WriteParams{Path: "kept.bin"}, bytes.NewReader(kept)); err != nil {
			t.Fatal(err)
		}
		filler := filepath.Join(data, "filler")
		f, _ := os.Create(filler)
		for {
			if _, err := f.Write(make([]byte, 1<<20)); err != nil {
				break
			}
		}
		f.Close()

		if sb, err := m.Create(ctx, sandbox.CreateOptions{Runtime: rt}); err == nil {
			t.Errorf("create on a full data disk succeeded: %s", sb.ID)
			m.Kill(ctx, sb.ID)
		} else {
			t.Logf("create on a full disk: %v", err)
			if !strings.Contains(strings.ToLower(err.Error()), "space") && !strings.Contains(err.Error(), "full") {
				t.Errorf("create error does not say the disk is full: %v", err)
			}
		}
		if ents, _ := os.ReadDir(cfg.StateDir); len(ents) != 1 {
			t.Errorf("state dir after the failed create: %v", ents)
		}
		if r, err := a.TryExec(wire.ExecParams{Cmd: "echo ok", TimeoutMs: 30_000}); err != nil || r.Stdout != "ok\n" {
			t.Errorf("running sandbox on a full disk: %q, %v", r.Stdout, err)
		}
		more := bytes.Repeat([]byte("more "), 1_600_000) // 8 MB
		if _, err := a.Agent.WriteFile(ctx, wire.WriteParams{Path: "more.bin"}, bytes.NewReader(more)); err != nil {
			t.Logf("upload on a full disk: %v", err)
		} else {
			var got bytes.Buffer
			if _, err := a.Agent.ReadFile(ctx, wire.PathParams{Path: "more.bin"}, &got); err != nil || !bytes.Equal(got.Bytes(), more) {
				t.Errorf("upload acknowledged on a full disk reads back %d bytes, %v", got.Len(), err)
			}
			// Past every cache (the sentry's included): drop the host's
			// clean pages (pages whose writeback failed are clean too)
			// and read the layer's upper dir from the host.
			os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0)
			paths, _ := filepath.Glob(filepath.Join(cfg.StateDir, a.SB.ID.String(), "*", "*", "upper", "home", "user", "more.bin"))
			if len(paths) != 1 {
				t.Fatalf("upload not found in the layer on the host: %v", paths)
			}
			if onDisk, err := os.ReadFile(paths[0]); err != nil || !bytes.Equal(onDisk, more) {
				t.Errorf("upload acknowledged on a full disk is not on the disk: %d bytes, %v", len(onDisk), err)
			} else {
				t.Log("upload on a full disk was acknowledged and is on the disk")
			}
		}
		var got bytes.Buffer
		if _, err := a.Agent.ReadFile(ctx, wire.PathParams{Path: "kept.bin"}, &got); err != nil || !bytes.Equal(got.Bytes(), kept) {
			t.Errorf("file acknowledged before the disk filled: %d bytes, %v", got.Len(), err)
		}

		os.Remove(filler)
		b := sandboxtest.Create(t, m, sandbox.CreateOptions{Runtime: rt})
		if r := b.Sh("echo ok"); r.Stdout != "ok\n" {
			t.Errorf("create after freeing space: %q", r.Stdout)
		}
		for _, box := range []*sandboxtest.Box{a, b} {
			if err := m.Kill(ctx, box.SB.ID); err != nil {
				t.Errorf("kill: %v", err)
			}
		}
		assertGone(t, cfg, a.SB.ID, b.SB.ID)
	})
}
