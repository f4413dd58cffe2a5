package oci

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

func TestNewSpec(t *testing.T) {
	s := NewSpec(SpecOptions{
		Rootfs: "/r", Args: []string{"/.kiln/kiln-agent"}, Env: []string{"A=b"},
		Hostname: "sb1", CgroupsPath: "/kiln/sb1", AgentDir: "/opt/agent",
		Limits: Limits{MemoryBytes: 512 << 20, CPUs: 1.5, Pids: 128},
	})
	if s.Root.Path != "/r" || s.Root.Readonly || s.Hostname != "sb1" || s.Linux.CgroupsPath != "/kiln/sb1" {
		t.Errorf("root/hostname/cgroups: %+v %q %q", s.Root, s.Hostname, s.Linux.CgroupsPath)
	}
	p := s.Process
	if p.User.UID != 0 || p.NoNewPrivileges || p.Cwd != "/" || p.Terminal {
		t.Errorf("process: %+v", p)
	}
	if !slices.Equal(p.Env, []string{DefaultPath, "A=b"}) {
		t.Errorf("env = %q", p.Env)
	}
	for _, set := range [][]string{p.Capabilities.Bounding, p.Capabilities.Effective, p.Capabilities.Permitted} {
		if !slices.Equal(set, defaultCaps) {
			t.Errorf("caps = %v", set)
		}
	}
	for _, c := range []string{"CAP_SYS_ADMIN", "CAP_SYS_MODULE", "CAP_SYS_PTRACE", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_MKNOD", "CAP_SETFCAP"} {
		if slices.Contains(p.Capabilities.Bounding, c) {
			t.Errorf("%s granted", c)
		}
	}
	if len(p.Capabilities.Inheritable) != 0 || len(p.Capabilities.Ambient) != 0 {
		t.Errorf("inheritable/ambient caps granted: %+v", p.Capabilities)
	}
	r := s.Linux.Resources
	if *r.Memory.Limit != 512<<20 || *r.Memory.Swap != 512<<20 {
		t.Errorf("memory = %d swap %d", *r.Memory.Limit, *r.Memory.Swap)
	}
	if *r.CPU.Quota != 150000 || *r.CPU.Period != 100000 {
		t.Errorf("cpu = %d/%d", *r.CPU.Quota, *r.CPU.Period)
	}
	if r.Pids.Limit != 128 {
		t.Errorf("pids = %d", r.Pids.Limit)
	}
	var ns []string
	for _, n := range s.Linux.Namespaces {
		if n.Path != "" {
			t.Errorf("namespace %s joins %s", n.Type, n.Path)
		}
		ns = append(ns, string(n.Type))
	}
	slices.Sort(ns)
	if want := []string{"ipc", "mount", "network", "pid", "uts"}; !slices.Equal(ns, want) {
		t.Errorf("namespaces = %v, want %v", ns, want)
	}
	agent := s.Mounts[len(s.Mounts)-1]
	if agent.Destination != AgentMount || agent.Source != "/opt/agent" || !slices.Contains(agent.Options, "ro") {
		t.Errorf("agent mount = %+v", agent)
	}
	var denied []string
	for _, sc := range s.Linux.Seccomp.Syscalls {
		denied = append(denied, sc.Names...)
	}
	for _, name := range []string{"mount", "umount2", "pivot_root", "init_module", "finit_module", "kexec_load", "bpf", "keyctl", "unshare", "clone3"} {
		if !slices.Contains(denied, name) {
			t.Errorf("seccomp does not filter %s", name)
		}
	}
	if !slices.Contains(s.Linux.MaskedPaths, "/proc/kcore") || !slices.Contains(s.Linux.ReadonlyPaths, "/proc/sys") {
		t.Error("masked/readonly paths missing")
	}
}

func TestNewSpecDefaults(t *testing.T) {
	s := NewSpec(SpecOptions{Rootfs: "/r", Args: []string{"x"}, Env: []string{"PATH=/bin"}, Cwd: "/w"})
	if !slices.Equal(s.Process.Env, []string{"PATH=/bin"}) || s.Process.Cwd != "/w" {
		t.Errorf("env %q cwd %q", s.Process.Env, s.Process.Cwd)
	}
	r := s.Linux.Resources
	if r.Memory != nil || r.CPU != nil || r.Pids != nil {
		t.Errorf("limits set without being asked: %+v", r)
	}
	for _, m := range s.Mounts {
		if m.Destination == AgentMount {
			t.Error("agent mount without AgentDir")
		}
	}
}

func TestBundleRoundTrip(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "b")
	b := &Bundle{Dir: dir, Spec: NewSpec(SpecOptions{Rootfs: "/r", Args: []string{"x"}, Hostname: "h"})}
	if err := b.Write(); err != nil {
		t.Fatal(err)
	}
	got, err := ReadBundle(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.Hostname != "h" || got.Spec.Root.Path != "/r" {
		t.Errorf("read back %+v", got.Spec)
	}
}

func TestCheckID(t *testing.T) {
	for _, id := range []string{"sb-1", "a_b.c", "X9"} {
		if err := checkID(id); err != nil {
			t.Errorf("checkID(%q) = %v", id, err)
		}
	}
	for _, id := range []string{"", "-x", ".", "..", "a/b", "a b", "../x"} {
		if err := checkID(id); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("checkID(%q) = %v, want ErrInvalidArgument", id, err)
		}
	}
}

func TestCgroupStatsPath(t *testing.T) {
	for _, p := range []string{"", "kiln/x", "/", "/..", "/../etc", "slice:kiln:x"} {
		if _, err := CgroupStats(p); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("CgroupStats(%q) = %v, want ErrInvalidArgument", p, err)
		}
	}
	if _, err := CgroupStats("/kiln/no-such-sandbox"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("CgroupStats(missing) = %v, want ErrNotFound", err)
	}
}

func TestRunscFlags(t *testing.T) {
	dir := t.TempDir()
	fake := func(version string) string {
		p := filepath.Join(dir, strings.ReplaceAll(version, " ", "_"))
		os.WriteFile(p, []byte("#!/bin/sh\necho 'runsc version "+version+"'\necho 'spec: 1.0.2'\n"), 0o755)
		return p
	}
	tests := []struct {
		version, platform string
		want              []string
	}{
		{"0.0~20221219.0", "", []string{"--platform=ptrace"}},
		{"go-20260905035102-160fafc42237", "", []string{"--platform=systrap", "--overlay2=none"}},
		{"release-20240101.0", "ptrace", []string{"--platform=ptrace", "--overlay2=none"}},
	}
	for _, tt := range tests {
		got := RunscFlags(context.Background(), fake(tt.version), tt.platform)
		if strings.Join(got, " ") != strings.Join(tt.want, " ") {
			t.Errorf("%s: got %v, want %v", tt.version, got, tt.want)
		}
	}
	if got := RunscFlags(context.Background(), filepath.Join(dir, "missing"), ""); got[0] != "--platform=ptrace" {
		t.Errorf("missing binary: %v", got)
	}
}

// Only under runsc does the agent get agentCaps (CAP_SYS_RESOURCE, for the
// pids limit inside gVisor); runc sandboxes keep Docker's set.
func TestAgentCapsOnlyForRunsc(t *testing.T) {
	for rt, want := range map[string]bool{"runsc": true, "runc": false, "": false} {
		p := NewSpec(SpecOptions{Rootfs: "/r", Runtime: rt}).Process
		for _, set := range [][]string{p.Capabilities.Bounding, p.Capabilities.Effective, p.Capabilities.Permitted} {
			if got := slices.Contains(set, "CAP_SYS_RESOURCE"); got != want {
				t.Errorf("runtime %q: CAP_SYS_RESOURCE granted %v, want %v", rt, got, want)
			}
		}
	}
}
