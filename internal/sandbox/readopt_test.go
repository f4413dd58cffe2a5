package sandbox_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agent/wire"
	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

func TestLimits(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		m := newManager(t, testConfig(t))
		e := create(t, m, sandbox.CreateOptions{Runtime: rt, Limits: sandbox.Limits{
			MemoryBytes: 256 * config.MiB, DiskBytes: 128 * config.MiB,
		}})
		other := create(t, m, sandbox.CreateOptions{Runtime: rt})

		t.Run("memory bomb", func(t *testing.T) {
			r := e.exec(wire.ExecParams{Args: []string{"python3", "-c", "x = []\nwhile True: x.append(bytearray(16 << 20))"}, TimeoutMs: 120_000})
			if r.exit.Reason != api.ExitOOM || !strings.Contains(r.exit.Message, "out of memory") {
				t.Fatalf("memory bomb: exit %+v stderr %q; want out_of_memory", r.exit, r.stderr)
			}
			if r := e.sh("echo ok"); r.stdout != "ok\n" {
				t.Fatalf("sandbox unusable after OOM: %q", r.stdout)
			}
		})

		t.Run("fork bomb", func(t *testing.T) {
			// Enough memory that the pids limit, not memory, stops it.
			e := create(t, m, sandbox.CreateOptions{Runtime: rt, Limits: sandbox.Limits{MemoryBytes: config.GiB, Pids: 128}})
			r := e.exec(wire.ExecParams{Args: []string{"python3", "-c", `
import os, time
n = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(30); os._exit(0)
        n += 1
except OSError as e:
    print("contained after", n, e.errno)
`}, TimeoutMs: 60_000})
			// runc: the kernel's limit on the user cgroup makes fork
			// fail. runsc: the agent's guard kills the tree.
			switch {
			case strings.Contains(r.stdout, "contained after"):
				n, _ := strconv.Atoi(strings.Fields(r.stdout)[2])
				if n > 128 {
					t.Errorf("forked %d processes with a pids limit of 128", n)
				}
			case r.exit.Reason == api.ExitPidsLimit && strings.Contains(r.exit.Message, "too many processes"):
			default:
				t.Fatalf("fork bomb not contained: stdout %q stderr %q exit %+v", r.stdout, r.stderr, r.exit)
			}
			// The bomb's children (runc) hold the pids until killed and
			// reaped; then the sandbox must be usable again.
			ctx := context.Background()
			var err error
			for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
				e.agent.Exec(ctx, wire.ExecParams{Args: []string{"pkill", "-9", "python3"}, User: wire.UserRoot}, func(api.Event) error { return nil })
				var exit *api.ExitStatus
				if exit, err = e.agent.Exec(ctx, wire.ExecParams{Args: []string{"true"}}, func(api.Event) error { return nil }); err == nil && exit.Code == 0 {
					break
				}
			}
			if err != nil {
				t.Fatalf("sandbox unusable after fork bomb: %v", err)
			}
		})

		t.Run("disk full", func(t *testing.T) {
			var before, after = hostFree(t), int64(0)
			r := e.sh("dd if=/dev/zero of=/home/user/fill bs=1M count=1024 2>&1; echo rc=$?")
			if !strings.Contains(r.stdout, "No space left on device") || !strings.Contains(r.stdout, "rc=1") {
				t.Fatalf("filling the disk: %q", r.stdout)
			}
			after = hostFree(t)
			if before-after > 256*config.MiB {
				t.Errorf("host lost %d MiB filling a 128 MiB sandbox disk", (before-after)/config.MiB)
			}
			_, err := e.agent.WriteFile(context.Background(), wire.WriteParams{Path: "more"}, strings.NewReader(strings.Repeat("x", 1<<20)))
			if err == nil || !strings.Contains(err.Error(), "disk full") {
				t.Errorf("upload to a full disk: %v, want disk full", err)
			}
			e.sh("rm -f /home/user/fill")
			if r := e.sh("echo ok > /home/user/ok && cat /home/user/ok"); r.stdout != "ok\n" {
				t.Errorf("after freeing space: %q", r.stdout)
			}
		})

		t.Run("others unaffected", func(t *testing.T) {
			if r := other.sh("echo fine"); r.stdout != "fine\n" {
				t.Fatalf("neighbour sandbox: %q", r.stdout)
			}
		})
	})
}

func hostFree(t *testing.T) int64 {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(config.FromEnv().DataDir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * st.Bsize
}

func TestIsolation(t *testing.T) {
	// A server on the host's loopback that no sandbox may reach.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("host secret\n"))
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	marker := fmt.Sprintf("/tmp/kiln-isolation-%d", os.Getpid())
	os.WriteFile(marker, []byte("x"), 0o644)
	defer os.Remove(marker)

	forEachRuntime(t, func(t *testing.T, rt string) {
		m := newManager(t, testConfig(t))
		e := create(t, m, sandbox.CreateOptions{Runtime: rt})
		checks := []struct {
			name, cmd, want string
			root            bool
		}{
			{"host processes", fmt.Sprintf("kill -0 %d 2>/dev/null && echo visible || echo hidden", os.Getpid()), "hidden", true},
			{"own pid namespace", "ps -e --no-headers | wc -l | awk '{print ($1 < 20) ? \"small\" : \"big\"}'", "small", false},
			{"host files", "test -e " + marker + " && echo visible || echo hidden", "hidden", true},
			{"mount", "mount -t tmpfs none /mnt 2>/dev/null && echo mounted || echo denied", "denied", true},
			{"kernel modules", "python3 -c 'import ctypes,os; l=ctypes.CDLL(None,use_errno=True); r=l.syscall(175,0,0,0); print(\"loaded\" if r==0 else \"denied\")'", "denied", true},
			{"host loopback", fmt.Sprintf("python3 -c 'import socket; socket.create_connection((\"127.0.0.1\",%d),timeout=2); print(\"reached\")' 2>/dev/null || echo unreachable", port), "unreachable", false},
			{"outside network", "python3 -c 'import socket; socket.create_connection((\"192.0.2.1\",80),timeout=2)' 2>/dev/null && echo reached || echo unreachable", "unreachable", false},
		}
		for _, c := range checks {
			t.Run(c.name, func(t *testing.T) {
				p := wire.ExecParams{Cmd: c.cmd, TimeoutMs: 30_000}
				if c.root {
					p.User = wire.UserRoot
				}
				if r := e.exec(p); strings.TrimSpace(r.stdout) != c.want {
					t.Errorf("%s: got %q (stderr %q), want %q", c.cmd, r.stdout, r.stderr, c.want)
				}
			})
		}
	})
}

// A new Manager on the same state dir (kiln serve restarted after a crash)
// re-adopts running sandboxes with their processes and files.
func TestReadoptAfterRestart(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		cfg := testConfig(t)
		cfg.Adopt = true
		m1 := newManager(t, cfg)
		e := create(t, m1, sandbox.CreateOptions{Runtime: rt})
		e.sh("echo kept > /home/user/state.txt")
		ctx, cancel := context.WithCancel(context.Background())
		pidc := make(chan int, 1)
		go e.agent.Exec(ctx, wire.ExecParams{Cmd: "for i in $(seq 1 30); do echo tick $i; sleep 0.1; done", Tag: "ticker"}, func(ev api.Event) error {
			if ev.Type == api.EventStart {
				pidc <- ev.PID
			}
			return nil
		})
		pid := <-pidc
		m1.Close() // like a crash: the channel goes, the sandbox stays
		cancel()

		m2 := newManager(t, cfg)
		sb, err := m2.Get(context.Background(), e.sb.ID)
		if err != nil || sb.State != sandbox.StateRunning {
			t.Fatalf("after restart: %+v, %v", sb, err)
		}
		e2 := &env{t: t, m: m2, sb: sb}
		if e2.agent, err = m2.Agent(sb.ID); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m2.Kill(context.Background(), sb.ID) })
		if r := e2.sh("cat /home/user/state.txt"); r.stdout != "kept\n" {
			t.Errorf("file after restart: %q", r.stdout)
		}
		var out strings.Builder
		actx, acancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer acancel()
		exit, err := e2.agent.Attach(actx, wire.AttachParams{PID: pid}, func(ev api.Event) error {
			out.Write(ev.Data)
			return nil
		})
		if err != nil || exit.Code != 0 || !strings.Contains(out.String(), "tick 30\n") {
			t.Fatalf("re-attached ticker: exit %+v err %v output tail %q", exit, err, tail(out.String()))
		}
	})
}

func tail(s string) string {
	if len(s) > 200 {
		return s[len(s)-200:]
	}
	return s
}
