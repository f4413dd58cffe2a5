package oci_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/oci"
	"github.com/kiln-sh/kiln/internal/oci/ocitest"
)

const memLimit = 256 << 20

// runtimes lists the runtimes under test, as Kiln configures them; each
// uses its own state root.
func runtimes() []*oci.CLI {
	runsc := config.Default().RunscPath
	return []*oci.CLI{
		oci.Runsc(oci.Config{Binary: runsc, Root: "/run/kiln-test/runsc", Flags: oci.RunscFlags(context.Background(), runsc, "")}),
		oci.Runc(oci.Config{Root: "/run/kiln-test/runc"}),
	}
}

var seq atomic.Int64

// sandbox is a started container with FIFO stdio.
type sandbox struct {
	rt          *oci.CLI
	id          string
	cgroupsPath string
	bundle      string
	in, out     *os.File
	r           *bufio.Reader
}

// start runs args in a fresh container on a layer over the template rootfs.
func start(t *testing.T, rt *oci.CLI, args []string, edit func(*oci.SpecOptions)) *sandbox {
	t.Helper()
	ocitest.RequireRoot(t)
	_, err := exec.LookPath(rt.Name())
	ocitest.Require(t, err == nil, rt.Name()+" not installed")
	root := ocitest.Layer(t, 256<<20)

	id := fmt.Sprintf("kt-%s-%d-%04d", rt.Name(), os.Getpid(), seq.Add(1)) // fixed width: no id is a prefix of another
	dir := t.TempDir()
	opts := oci.SpecOptions{
		Rootfs: root, Args: args, Hostname: id, CgroupsPath: "/kiln/" + id,
		Limits: oci.Limits{MemoryBytes: memLimit, CPUs: 1, Pids: 64},
	}
	if edit != nil {
		edit(&opts)
	}
	b := &oci.Bundle{Dir: filepath.Join(dir, "bundle"), Spec: oci.NewSpec(opts)}
	if err := b.Write(); err != nil {
		t.Fatal(err)
	}
	s := &sandbox{rt: rt, id: id, cgroupsPath: opts.CgroupsPath, bundle: b.Dir}
	s.in, s.out = fifo(t, dir, "in"), fifo(t, dir, "out")
	s.r = bufio.NewReader(s.out)

	ctx := context.Background()
	t.Cleanup(func() {
		if err := rt.Delete(ctx, id, true); err != nil {
			t.Errorf("cleanup delete: %v", err)
		}
	})
	begin := time.Now()
	if err := rt.Create(ctx, id, b, oci.IO{Stdin: s.in, Stdout: s.out}); err != nil {
		t.Fatalf("Create: %v", err)
	}
	if err := rt.Start(ctx, id); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Logf("%s create+start: %v", rt.Name(), time.Since(begin))
	return s
}

// fifo makes a named pipe opened read-write, so neither end sees EOF.
func fifo(t *testing.T, dir, name string) *os.File {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := syscall.Mkfifo(p, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func (s *sandbox) readLine(t *testing.T, timeout time.Duration) string {
	t.Helper()
	s.out.SetReadDeadline(time.Now().Add(timeout))
	line, err := s.r.ReadString('\n')
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(s.bundle, oci.CreateLog))
		t.Fatalf("reading sandbox output: %v (got %q); create.log: %s", err, line, log)
	}
	return strings.TrimSuffix(line, "\n")
}

func (s *sandbox) waitStatus(t *testing.T, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := s.rt.State(context.Background(), s.id)
		if err == nil && st.Status == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: state %+v, %v", want, st, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitDead waits until the container has stopped or its runtime no
// longer knows it (a crashed runsc sandbox may take its state with it).
func (s *sandbox) waitDead(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		st, err := s.rt.State(context.Background(), s.id)
		if (err == nil && st.Status == oci.StatusStopped) || errors.Is(err, errdefs.ErrNotFound) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for the container to die: state %+v, %v", st, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func forEachRuntime(t *testing.T, f func(t *testing.T, rt *oci.CLI)) {
	for _, rt := range runtimes() {
		t.Run(rt.Name(), func(t *testing.T) {
			t.Parallel()
			f(t, rt)
		})
	}
}

func TestLifecycle(t *testing.T) {
	t.Parallel()
	forEachRuntime(t, func(t *testing.T, rt *oci.CLI) {
		ctx := context.Background()
		s := start(t, rt, []string{"/bin/cat"}, nil)

		fmt.Fprintln(s.in, "hello")
		if got := s.readLine(t, 10*time.Second); got != "hello" {
			t.Fatalf("echo: got %q", got)
		}
		st, err := rt.State(ctx, s.id)
		if err != nil || st.Status != oci.StatusRunning || st.Pid <= 0 || st.ID != s.id {
			t.Fatalf("State = %+v, %v; want running with a pid", st, err)
		}
		stats, err := oci.CgroupStats(s.cgroupsPath)
		if err != nil {
			t.Fatalf("CgroupStats: %v", err)
		}
		if stats.MemoryLimit != memLimit || stats.PidsLimit != 64 || stats.MemoryUsage <= 0 || stats.Pids <= 0 {
			t.Errorf("CgroupStats = %+v; want memory limit %d, pids limit 64, usage > 0", stats, memLimit)
		}

		if err := rt.Pause(ctx, s.id); err != nil {
			t.Fatalf("Pause: %v", err)
		}
		s.waitStatus(t, oci.StatusPaused)
		fmt.Fprintln(s.in, "while paused")
		if err := rt.Resume(ctx, s.id); err != nil {
			t.Fatalf("Resume: %v", err)
		}
		s.waitStatus(t, oci.StatusRunning)
		if got := s.readLine(t, 10*time.Second); got != "while paused" {
			t.Fatalf("echo after resume: got %q", got)
		}

		if err := rt.Kill(ctx, s.id, syscall.SIGKILL); err != nil {
			t.Fatalf("Kill: %v", err)
		}
		s.waitStatus(t, oci.StatusStopped)
		// runsc may report stopped a moment before its sandbox process
		// has gone, and refuses a plain delete until then.
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			err := rt.Delete(ctx, s.id, false)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("Delete: %v", err)
			}
		}
		if _, err := rt.State(ctx, s.id); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("State after Delete = %v, want ErrNotFound", err)
		}
		if err := rt.Delete(ctx, s.id, true); err != nil {
			t.Errorf("second Delete: %v", err)
		}
		assertNoLeftovers(t, s, st.Pid)
	})
}

// TestForceDelete deletes a running container outright.
func TestForceDelete(t *testing.T) {
	t.Parallel()
	forEachRuntime(t, func(t *testing.T, rt *oci.CLI) {
		s := start(t, rt, []string{"/bin/cat"}, nil)
		st, err := rt.State(context.Background(), s.id)
		if err != nil {
			t.Fatal(err)
		}
		// Pids (runsc: from its state file, no command) agrees with State.
		want := append([]int{st.Pid}, st.HelperPids...)
		if pids, err := rt.Pids(context.Background(), s.id); err != nil || !slices.Equal(pids, want) {
			t.Errorf("Pids = %v, %v; want %v (State)", pids, err, want)
		}
		if rt.Name() == "runsc" {
			// Read from its state file, not through the fallback to State.
			pid, gofer, bundle, ok := rt.StateFile(s.id)
			if !ok || !slices.Equal([]int{pid, gofer}, want) || bundle != s.bundle {
				t.Errorf("runsc state file: %d, %d, %q, %v; want %v and bundle %q", pid, gofer, bundle, ok, want, s.bundle)
			}
		}
		// Delete finds the container's cgroups (runsc: its bundle from its
		// state file) and removes them: assertNoLeftovers.
		if err := rt.Delete(context.Background(), s.id, true); err != nil {
			t.Fatalf("Delete(force): %v", err)
		}
		assertNoLeftovers(t, s, st.Pid)
	})
}

func TestUnknownID(t *testing.T) {
	t.Parallel()
	forEachRuntime(t, func(t *testing.T, rt *oci.CLI) {
		ocitest.RequireRoot(t)
		_, err := exec.LookPath(rt.Name())
		ocitest.Require(t, err == nil, rt.Name()+" not installed")
		ctx := context.Background()
		if _, err := rt.State(ctx, "kt-no-such-id"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("State(unknown) = %v, want ErrNotFound", err)
		}
		if err := rt.Delete(ctx, "kt-no-such-id", true); err != nil {
			t.Errorf("Delete(unknown) = %v, want nil", err)
		}
		if _, err := rt.State(ctx, "../etc"); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("State(../etc) = %v, want ErrInvalidArgument", err)
		}
	})
}

// TestCreateFails checks a failed create reports the runtime's message and
// leaves nothing behind.
func TestCreateFails(t *testing.T) {
	t.Parallel()
	forEachRuntime(t, func(t *testing.T, rt *oci.CLI) {
		ocitest.RequireRoot(t)
		_, err := exec.LookPath(rt.Name())
		ocitest.Require(t, err == nil, rt.Name()+" not installed")
		ctx := context.Background()
		id := fmt.Sprintf("kt-%s-%d-%04d", rt.Name(), os.Getpid(), seq.Add(1)) // fixed width: no id is a prefix of another
		b := &oci.Bundle{Dir: filepath.Join(t.TempDir(), "bundle"), Spec: oci.NewSpec(oci.SpecOptions{
			Rootfs: "/nonexistent/rootfs", Args: []string{"/bin/true"}, CgroupsPath: "/kiln/" + id,
		})}
		if err := b.Write(); err != nil {
			t.Fatal(err)
		}
		err = rt.Create(ctx, id, b, oci.IO{})
		if err == nil {
			rt.Delete(ctx, id, true)
			t.Fatal("Create with a missing rootfs succeeded")
		}
		t.Logf("Create error: %v", err)
		if !strings.Contains(err.Error(), "create "+id) {
			t.Errorf("error lacks context: %v", err)
		}
		if _, err := rt.State(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("State after failed Create = %v, want ErrNotFound", err)
		}
		if cgs, _ := filepath.Glob("/sys/fs/cgroup/*/kiln/" + id); len(cgs) > 0 {
			t.Errorf("cgroups left: %v", cgs)
		}
	})
}

func TestHostname(t *testing.T) {
	t.Parallel()
	forEachRuntime(t, func(t *testing.T, rt *oci.CLI) {
		s := start(t, rt, []string{"/bin/hostname"}, nil)
		if got := s.readLine(t, 10*time.Second); got != s.id {
			t.Errorf("hostname = %q, want %q", got, s.id)
		}
	})
}

const mountProbe = `
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
r = libc.mount(b"x", b"/mnt", b"tmpfs", 0, None)
print("mount", r, ctypes.get_errno(), flush=True)
`

// TestNoMount calls mount(2) directly: mount(8) from bookworm fails earlier
// under this runsc (statx gives EINVAL), which would prove nothing.
func TestNoMount(t *testing.T) {
	t.Parallel()
	forEachRuntime(t, func(t *testing.T, rt *oci.CLI) {
		s := start(t, rt, []string{"/usr/bin/python3", "-c", mountProbe}, nil)
		if got, want := s.readLine(t, 20*time.Second), fmt.Sprint("mount -1 ", int(syscall.EPERM)); got != want {
			t.Errorf("mount(2) inside: %q, want %q", got, want)
		}
	})
}

const forkBomb = `
import os, time
n = 0
try:
    while n < 1000:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        n += 1
    print("forks", n, 0, flush=True)
except OSError as e:
    print("forks", n, e.errno, flush=True)
`

// TestPidsLimit runs a fork bomb under a pids limit of 64. Under runc fork
// fails with EAGAIN. Under runsc (ptrace) the limit counts the Sentry's
// threads and one stub process per app process; when it is hit the Sentry
// panics ("creating stub process: resource temporarily unavailable") and
// the sandbox stops: contained, but fatal to the sandbox.
func TestPidsLimit(t *testing.T) {
	t.Parallel()
	forEachRuntime(t, func(t *testing.T, rt *oci.CLI) {
		s := start(t, rt, []string{"/usr/bin/python3", "-c", forkBomb}, nil)
		if rt.Name() == "runsc" {
			s.waitDead(t)
		} else {
			got := s.readLine(t, 30*time.Second)
			var n, errno int
			if _, err := fmt.Sscanf(got, "forks %d %d", &n, &errno); err != nil || n >= 64 || errno != int(syscall.EAGAIN) {
				t.Errorf("fork bomb: %q; want EAGAIN below 64 tasks", got)
			}
		}
		if st, err := oci.CgroupStats(s.cgroupsPath); err == nil && st.Pids > 64 {
			t.Errorf("pids.current = %d over the limit", st.Pids)
		}
		if err := exec.Command("true").Run(); err != nil {
			t.Errorf("host fork after bomb: %v", err)
		}
	})
}

const netProbe = `
import socket, sys
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2).close()
    print("host reachable", flush=True)
except OSError as e:
    print("host unreachable", e.errno, flush=True)
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen()
socket.create_connection(s.getsockname(), timeout=2).close()
print("loopback ok", flush=True)
`

func TestNetworkIsolated(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	port := fmt.Sprint(ln.Addr().(*net.TCPAddr).Port)
	forEachRuntime(t, func(t *testing.T, rt *oci.CLI) {
		s := start(t, rt, []string{"/usr/bin/python3", "-c", netProbe, port}, nil)
		if got := s.readLine(t, 20*time.Second); !strings.HasPrefix(got, "host unreachable") {
			t.Errorf("connecting to the host's 127.0.0.1:%s: %q", port, got)
		}
		if got := s.readLine(t, 20*time.Second); got != "loopback ok" {
			t.Errorf("loopback inside: %q", got)
		}
	})
}

// assertNoLeftovers checks a deleted container left no process, cgroup or
// runtime state behind.
func assertNoLeftovers(t *testing.T, s *sandbox, pid int) {
	t.Helper()
	// The init process is reparented to the host's init, which reaps it
	// soon after; a zombie is dead enough.
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil || strings.Contains(string(b), ") Z ") {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("init pid %d still alive: %s", pid, b)
			break
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && (strings.Contains(string(b), s.id) || strings.Contains(string(b), s.bundle)) {
			t.Errorf("process left: %s: %q", p, strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	cgs, _ := filepath.Glob("/sys/fs/cgroup/*" + s.cgroupsPath)
	for _, cg := range cgs {
		t.Errorf("cgroup left: %s", cg)
	}
	state, _ := filepath.Glob(filepath.Join(s.rt.Root(), "*"+s.id+"*"))
	for _, f := range state {
		t.Errorf("runtime state left: %s", f)
	}
}
