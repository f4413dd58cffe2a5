package security

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/sandbox/sandboxtest"
	"github.com/kiln-sh/kiln/internal/template"
)

// agentPath is a kiln-agent built once for the package's tests.
var agentPath string

// host holds what the attacks try to reach on the host: a secret file, a
// secret in the test process's environment, a service on the host's
// loopback.
var host struct {
	marker, secret string
	port           int
}

func TestMain(m *testing.M) {
	host.secret = fmt.Sprintf("kiln-canary-%d", os.Getpid())
	host.marker = filepath.Join(os.TempDir(), host.secret)
	os.WriteFile(host.marker, []byte(host.secret), 0o644)
	os.Setenv("KILN_SECURITY_CANARY", host.secret)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	host.port = ln.Addr().(*net.TCPAddr).Port
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte(host.secret + "\n"))
			c.Close()
		}
	}()
	code := sandboxtest.Main(m, &agentPath)
	ln.Close()
	os.Remove(host.marker)
	os.Exit(code)
}

// escape is one attempt to break out or spy, as a shell command that
// prints a verdict; want is the verdict every runtime must print unless
// the runtime has its own entry (with the reason in a comment).
type escape struct {
	name  string
	root  bool   // run as root inside the sandbox (the strongest attacker; the user reaches it through sudo)
	setup string // run as root first
	cmd   string
	want  map[string]string // runtime or "*" → verdict
}

func all(v string) map[string]string { return map[string]string{"*": v} }

func escapes() []escape {
	py := func(code string) string { return "python3 -c '" + code + "' 2>/dev/null" }
	m := host.marker
	return []escape{
		// Host files.
		{name: "host file by absolute path", root: true, cmd: "cat " + m + " 2>/dev/null || echo hidden", want: all("hidden")},
		{name: "host file through ..", root: true, cmd: "cd /tmp && cat ../../../../../../../.." + m + " 2>/dev/null || echo hidden", want: all("hidden")},
		{name: "host file through /proc/1/root", root: true, cmd: "cat /proc/1/root" + m + " 2>/dev/null || echo hidden", want: all("hidden")},
		{name: "host file through /proc/self/cwd/..", root: true, cmd: "cd / && cat /proc/self/cwd/../../.." + m + " 2>/dev/null || echo hidden", want: all("hidden")},
		{name: "host file through a symlink", root: true, cmd: "ln -sf " + m + " /tmp/l && cat /tmp/l 2>/dev/null || echo hidden", want: all("hidden")},
		{name: "host file through a hard link", root: true, cmd: "ln " + m + " /tmp/h 2>/dev/null && cat /tmp/h || echo hidden", want: all("hidden")},
		{name: "host data dir", root: true, cmd: "ls /var/lib/kiln/templates 2>/dev/null || echo hidden", want: all("hidden")},
		// Host processes and their secrets.
		{name: "host processes in /proc", root: true, cmd: "ls /proc | grep -c '^[0-9]' | awk '{print ($1 < 20) ? \"own only\" : \"host visible\"}'", want: all("own only")},
		{name: "host pid signal", root: true, cmd: fmt.Sprintf("kill -0 %d 2>/dev/null && echo visible || echo hidden", os.Getpid()), want: all("hidden")},
		{name: "host environment", root: true, cmd: "cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n' | grep -q " + host.secret + " && echo leaked || echo hidden", want: all("hidden")},
		{name: "pid 1 is the agent", root: true, cmd: "tr '\\0' ' ' < /proc/1/cmdline", want: all("/.kiln/kiln-agent")},
		{name: "ptrace the agent as user", cmd: py(`import ctypes; l=ctypes.CDLL(None,use_errno=True); print("attached" if l.syscall(101,16,1,0,0)==0 else "denied")`), want: all("denied")},
		{name: "ptrace the agent as root", root: true, cmd: py(`import ctypes; l=ctypes.CDLL(None,use_errno=True); print("attached" if l.syscall(101,16,1,0,0)==0 else "denied")`), want: all("denied")},
		// Privileged kernel interfaces.
		{name: "mount", root: true, cmd: "mount -t tmpfs none /mnt 2>/dev/null && echo mounted || echo denied", want: all("denied")},
		{name: "remount root read-write", root: true, cmd: "mount -o remount,rw / 2>/dev/null && echo remounted || echo denied", want: all("denied")},
		{name: "kernel module", root: true, cmd: py(`import ctypes; l=ctypes.CDLL(None,use_errno=True); print("loaded" if l.syscall(175,0,0,0)==0 else "denied")`), want: all("denied")},
		{name: "finit_module", root: true, cmd: py(`import ctypes; l=ctypes.CDLL(None,use_errno=True); print("loaded" if l.syscall(313,0,0,0)==0 else "denied")`), want: all("denied")},
		{name: "bpf", root: true, cmd: py(`import ctypes; l=ctypes.CDLL(None,use_errno=True); print("allowed" if l.syscall(321,0,0,0)>=0 else "denied")`), want: all("denied")},
		// Mapping root into a new user namespace needs CAP_SETFCAP, which
		// the sandbox's root lacks; runc's seccomp refuses the namespace
		// itself.
		{name: "user namespace", root: true, cmd: "unshare -Urm sh -c 'mount -t tmpfs none /mnt && echo mounted' 2>/dev/null || echo denied", want: all("denied")},
		{name: "user namespace as user", cmd: "unshare -Urm sh -c 'mount -t tmpfs none /mnt && echo mounted' 2>/dev/null || echo denied", want: map[string]string{
			"runc": "denied",
			// gVisor implements user namespaces inside the sentry: the
			// mount happens in the sandbox's own kernel, not the host's.
			"runsc": "mounted",
		}},
		{name: "raw socket as user", cmd: py(`import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1); print("opened")`) + " || echo denied", want: all("denied")},
		// No CAP_NET_RAW on either runtime: no raw IP or packet sockets
		// (forged packets, sniffing), even for root.
		{name: "raw socket as root", root: true, cmd: py(`import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); print("opened")`) + " || echo denied", want: all("denied")},
		{name: "packet socket as root", root: true, cmd: py(`import socket; socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0); print("opened")`) + " || echo denied", want: all("denied")},
		{name: "packet socket (datagram) as root", root: true, cmd: py(`import socket; socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, 0); print("opened")`) + " || echo denied", want: all("denied")},
		// Ping still works, through unprivileged ICMP sockets
		// (net.ipv4.ping_group_range in the sandbox's network namespace).
		{name: "ping as user", cmd: py(pingLoopback) + " || echo failed", want: all("reply")},
		{name: "ping as root", root: true, cmd: py(pingLoopback) + " || echo failed", want: all("reply")},
		{name: "block device node", root: true, cmd: "mknod /tmp/sda b 8 0 2>/dev/null; head -c1 /tmp/sda >/dev/null 2>&1 && echo read || echo denied", want: all("denied")},
		{name: "host memory devices", root: true, cmd: "ls /dev/mem /dev/kmem /dev/kmsg /dev/sda /dev/vda 2>/dev/null | wc -l", want: all("0")},
		{name: "/sys write", root: true, cmd: "(echo x > /sys/kernel/uevent_helper) 2>/dev/null && echo written || echo denied", want: all("denied")},
		{name: "/proc/sys write", root: true, cmd: "(echo 3 > /proc/sys/vm/drop_caches) 2>/dev/null && echo written || echo denied", want: all("denied")},
		{name: "sysrq trigger", root: true, cmd: "(echo h > /proc/sysrq-trigger) 2>/dev/null && echo written || echo denied", want: all("denied")},
		{name: "hostname change", root: true, cmd: "hostname evil 2>/dev/null && echo changed || echo denied", want: all("denied")},
		{name: "clock change", root: true, cmd: "date -s '2000-01-01' >/dev/null 2>&1 && echo changed || echo denied", want: all("denied")},
		{name: "cgroup escape", root: true, cmd: "(echo $$ > /sys/fs/cgroup/memory/cgroup.procs) 2>/dev/null && echo moved || echo denied", want: map[string]string{
			"runc": "denied",
			// gVisor's /sys/fs/cgroup is the sentry's own cgroupfs; the
			// host cgroup is checked unchanged by TestCgroupEscapeRunsc.
			"runsc": "moved",
		}},
		{name: "overwrite the shared agent binary", root: true, cmd: "(echo x > /.kiln/kiln-agent) 2>/dev/null && echo written || echo denied", want: all("denied")},
		// Sandboxes run without no-new-privileges, so that sudo works for
		// the user: a setuid-root binary makes the user root inside the
		// sandbox (runc). That is the root every check above marked root
		// runs as, so it is the strongest attacker already; the row after
		// checks that root gained through a setuid binary is held as well.
		{name: "setuid binary", root: false, setup: "cp /usr/bin/id /tmp/suid-id && chmod 4755 /tmp/suid-id",
			cmd: "/tmp/suid-id -u", want: map[string]string{
				"runc": "0",
				// gVisor's sentry ignores set-user-ID bits
				// (google/gvisor#212): sudo does not work under runsc.
				"runsc": "1000",
			}},
		{name: "mount as root through a setuid binary", root: false, setup: "cp /usr/bin/python3 /tmp/suid-py && chmod 4755 /tmp/suid-py",
			cmd:  `/tmp/suid-py -c 'import os, ctypes; l = ctypes.CDLL(None, use_errno=True); print(os.geteuid(), "mounted" if l.mount(b"none", b"/mnt", b"tmpfs", 0, None) == 0 else "denied")'`,
			want: map[string]string{"runc": "0 denied", "runsc": "1000 denied"}},
		// Network.
		{name: "host loopback service", cmd: fmt.Sprintf("timeout 5 bash -c 'cat < /dev/tcp/127.0.0.1/%d' 2>/dev/null || echo unreachable", host.port), want: all("unreachable")},
		{name: "outside network", cmd: "timeout 5 bash -c 'echo > /dev/tcp/192.0.2.1/80' 2>/dev/null && echo reached || echo unreachable", want: all("unreachable")},
		{name: "network interfaces", cmd: "ls /sys/class/net 2>/dev/null | grep -v '^lo$' | wc -l", want: all("0")},
	}
}

// pingLoopback sends one ICMP echo to 127.0.0.1 over an unprivileged
// ICMP socket, as ping does without CAP_NET_RAW, and prints "reply" when
// the echo reply comes back.
const pingLoopback = `
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)
s.settimeout(10)
s.sendto(b"\x08\x00\x00\x00\x00\x00\x00\x01kiln", ("127.0.0.1", 0))
data, _ = s.recvfrom(64)
print("reply" if data[0] == 0 and data.endswith(b"kiln") else "other")`

// TestEscape runs every escape attempt as commands in a sandbox of each
// runtime.
func TestEscape(t *testing.T) {
	sandboxtest.ForEachRuntime(t, func(t *testing.T, rt string) {
		m := sandboxtest.NewManager(t, sandboxtest.Config(t, agentPath))
		b := sandboxtest.Create(t, m, sandbox.CreateOptions{Runtime: rt})
		for _, e := range escapes() {
			t.Run(e.name, func(t *testing.T) {
				want, ok := e.want[rt]
				if !ok {
					want = e.want["*"]
				}
				if e.setup != "" {
					if r := b.RootSh(e.setup); r.Exit.Code != 0 {
						t.Fatalf("setup %q: %+v %q", e.setup, r.Exit, r.Stderr)
					}
				}
				p := wire.ExecParams{Cmd: e.cmd, TimeoutMs: 30_000}
				if e.root {
					p.User = wire.UserRoot
				}
				r := b.Exec(p)
				if got := strings.TrimSpace(r.Stdout); got != want {
					t.Errorf("%s: got %q (stderr %q), want %q", e.cmd, got, r.Stderr, want)
				}
			})
		}
	})
}

// TestRootKeepsWhatTemplatesNeed: the capabilities the sandbox's root
// keeps (internal/oci defaultCaps) are enough for what templates and
// setup scripts do as root: chown, writing others' files, su to the user,
// setuid/setgid bits, servers on ports below 1024, chroot, killing the
// user's processes.
func TestRootKeepsWhatTemplatesNeed(t *testing.T) {
	sandboxtest.ForEachRuntime(t, func(t *testing.T, rt string) {
		m := sandboxtest.NewManager(t, sandboxtest.Config(t, agentPath))
		b := sandboxtest.Create(t, m, sandbox.CreateOptions{Runtime: rt})
		for _, c := range []struct{ name, cmd, want string }{
			{"chown", "touch /tmp/c && chown 1000:1000 /tmp/c && stat -c %u:%g /tmp/c", "1000:1000"},
			{"write another user's private file", "install -o 1000 -m 600 /dev/null /tmp/p && echo x > /tmp/p && chmod 640 /tmp/p && stat -c %a /tmp/p", "640"},
			{"setuid and setgid bits", "cp /usr/bin/id /tmp/s && chown 1000:1000 /tmp/s && chmod 6755 /tmp/s && stat -c %a /tmp/s", "6755"},
			{"su to the user", "su -s /bin/sh user -c 'id -u'", "1000"},
			{"port 80", "python3 -c 'import socket; s = socket.socket(); s.bind((\"127.0.0.1\", 80)); print(\"bound\")'", "bound"},
			{"chroot", "chroot / /bin/echo chrooted", "chrooted"},
			{"kill the user's process", "su -s /bin/sh user -c 'sleep 300 & echo $!' > /tmp/pid; kill $(cat /tmp/pid) && echo killed", "killed"},
		} {
			t.Run(c.name, func(t *testing.T) {
				r := b.RootSh(c.cmd)
				if got := strings.TrimSpace(r.Stdout); got != c.want {
					t.Errorf("%s: got %q (exit %+v, stderr %q), want %q", c.cmd, got, r.Exit, r.Stderr, c.want)
				}
			})
		}
	})
}

// TestFilesEscape makes the same attempts through the files API: paths
// resolve inside the sandbox, as its kernel resolves them, and with the
// permissions of the user named.
func TestFilesEscape(t *testing.T) {
	sandboxtest.ForEachRuntime(t, func(t *testing.T, rt string) {
		m := sandboxtest.NewManager(t, sandboxtest.Config(t, agentPath))
		b := sandboxtest.Create(t, m, sandbox.CreateOptions{Runtime: rt})
		ctx := context.Background()
		b.RootSh("ln -sf " + host.marker + " /tmp/host-link && ln -sf /etc/shadow /home/user/shadow-link && ln -sf /etc/passwd /home/user/passwd-link")
		reads := []struct {
			name, path, user string
			want             error
		}{
			{"host file by absolute path", host.marker, wire.UserRoot, errdefs.ErrNotFound},
			{"host file through ..", "../../../../../.." + host.marker, wire.UserRoot, errdefs.ErrNotFound},
			{"host file through /proc/1/root", "/proc/1/root" + host.marker, wire.UserRoot, errdefs.ErrNotFound},
			{"host file through a symlink", "/tmp/host-link", wire.UserRoot, errdefs.ErrNotFound},
			{"shadow as user", "/etc/shadow", wire.UserDefault, errdefs.ErrPermissionDenied},
			{"shadow as user through a symlink", "shadow-link", wire.UserDefault, errdefs.ErrPermissionDenied},
		}
		for _, c := range reads {
			t.Run("read "+c.name, func(t *testing.T) {
				var got bytes.Buffer
				_, err := b.Agent.ReadFile(ctx, wire.PathParams{Path: c.path, User: c.user}, &got)
				if !errors.Is(err, c.want) || strings.Contains(got.String(), host.secret) {
					t.Errorf("read %s as %s: %v (%d bytes), want %v", c.path, c.user, err, got.Len(), c.want)
				}
			})
		}
		writes := []struct {
			name, path, user string
			want             error
		}{
			{"passwd as user through ..", "../../etc/passwd", wire.UserDefault, errdefs.ErrPermissionDenied},
			{"passwd as user through a symlink", "passwd-link", wire.UserDefault, errdefs.ErrPermissionDenied},
			{"the shared agent binary as root", "/.kiln/kiln-agent", wire.UserRoot, nil}, // any error
			{"sysctl as root", "/proc/sys/kernel/hostname", wire.UserRoot, nil},
		}
		for _, c := range writes {
			t.Run("write "+c.name, func(t *testing.T) {
				_, err := b.Agent.WriteFile(ctx, wire.WriteParams{Path: c.path, User: c.user}, strings.NewReader("owned\n"))
				if err == nil || (c.want != nil && !errors.Is(err, c.want)) {
					t.Errorf("write %s as %s: %v, want %v", c.path, c.user, err, c.want)
				}
			})
		}
		t.Run("move shadow as user", func(t *testing.T) {
			if _, err := b.Agent.Move(ctx, wire.MoveParams{From: "/etc/shadow", To: "/home/user/shadow", User: wire.UserDefault}); !errors.Is(err, errdefs.ErrPermissionDenied) {
				t.Errorf("move: %v, want permission denied", err)
			}
		})
		t.Run("stat host file", func(t *testing.T) {
			if _, err := b.Agent.Stat(ctx, wire.PathParams{Path: host.marker, User: wire.UserRoot}); !errors.Is(err, errdefs.ErrNotFound) {
				t.Errorf("stat: %v, want not found", err)
			}
		})
		if data, err := os.ReadFile(agentPath); err != nil || bytes.HasPrefix(data, []byte("owned")) {
			t.Errorf("the host's agent binary changed: %v", err)
		}
	})
}

// TestTemplateTamper: root in one sandbox rewrites system files, directly
// and through a hard link; the shared template on the host and a
// neighbour sandbox on the same template see the originals.
func TestTemplateTamper(t *testing.T) {
	tmpl, err := template.Lookup(config.FromEnv().DataDir, "base")
	if err != nil {
		t.Skip("no base template")
	}
	sandboxtest.ForEachRuntime(t, func(t *testing.T, rt string) {
		m := sandboxtest.NewManager(t, sandboxtest.Config(t, agentPath))
		attacker := sandboxtest.Create(t, m, sandbox.CreateOptions{Runtime: rt})
		neighbour := sandboxtest.Create(t, m, sandbox.CreateOptions{Runtime: rt})
		files := []string{"/etc/debian_version", "/etc/issue", "/usr/bin/true"}
		orig := map[string][]byte{}
		for _, f := range files {
			orig[f], _ = os.ReadFile(tmpl.File(f))
		}
		r := attacker.RootSh("ln /etc/debian_version /tmp/dv && echo tampered >> /tmp/dv; echo tampered > /etc/issue; " +
			"printf '#!/bin/sh\\nexit 7\\n' > /usr/bin/true; echo done")
		if strings.TrimSpace(r.Stdout) != "done" {
			t.Fatalf("tampering: %q %q", r.Stdout, r.Stderr)
		}
		if r := attacker.Sh("/usr/bin/true; echo $?"); strings.TrimSpace(r.Stdout) != "7" {
			t.Errorf("the attacker's own /usr/bin/true was not replaced: %q", r.Stdout)
		}
		for _, f := range files {
			if now, _ := os.ReadFile(tmpl.File(f)); orig[f] == nil || !bytes.Equal(now, orig[f]) {
				t.Errorf("template file %s changed on the host", f)
			}
		}
		if r := neighbour.Sh("grep -c tampered /etc/debian_version /etc/issue; /usr/bin/true; echo $?"); !strings.HasSuffix(r.Stdout, "0\n") || strings.Contains(r.Stdout, ":1") {
			t.Errorf("neighbour sees the tampering: %q", r.Stdout)
		}
	})
}

// TestCgroupEscapeRunsc: under gVisor a sandbox's root may move its
// processes between the sentry's own cgroups; the host's view is
// unchanged: every host process of the sandbox stays in its kiln cgroup.
func TestCgroupEscapeRunsc(t *testing.T) {
	m := sandboxtest.NewManager(t, sandboxtest.Config(t, agentPath))
	b := sandboxtest.Create(t, m, sandbox.CreateOptions{Runtime: "runsc"})
	procs := func() []string {
		data, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory/kiln", b.SB.ID.String(), "cgroup.procs"))
		return strings.Fields(string(data))
	}
	before := procs()
	b.RootSh("for c in memory pids cpu; do echo $$ > /sys/fs/cgroup/$c/cgroup.procs; done 2>/dev/null; python3 -c 'x = bytearray(64 << 20)'")
	// gVisor may add host processes (systrap stubs) to the cgroup; none
	// may leave it.
	after := procs()
	for _, p := range before {
		if !slices.Contains(after, p) {
			if _, err := os.Stat("/proc/" + p); err == nil {
				t.Errorf("host process %s left the sandbox's cgroup: %v before, %v after", p, before, after)
			}
		}
	}
	if len(before) == 0 {
		t.Error("no host processes in the sandbox's cgroup")
	}
}
