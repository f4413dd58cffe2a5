package oci

import (
	"maps"
	"syscall"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// PidsMount is where SpecOptions.PidsCgroup appears inside the sandbox;
// the agent dir must contain an empty "pids" dir as its mount point.
const PidsMount = "/.kiln/pids"

// AgentMount is where SpecOptions.AgentDir appears inside the sandbox.
const AgentMount = "/.kiln"

// DefaultPath is PATH when SpecOptions.Env sets none.
const DefaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

const cfsPeriod = 100_000 // µs

// Limits caps a sandbox's resources; zero fields mean unlimited.
type Limits struct {
	MemoryBytes int64   // memory limit; swap is disallowed (memsw = limit)
	CPUs        float64 // CPU bandwidth, in cores
	Pids        int64   // max tasks (processes + threads)
}

// SpecOptions describes one sandbox's container.
type SpecOptions struct {
	Rootfs      string // absolute path of the root filesystem
	Args        []string
	Env         []string // KEY=value; PATH defaults to DefaultPath
	Cwd         string   // default "/"
	Hostname    string
	Limits      Limits
	CgroupsPath string // e.g. "/kiln/<id>"
	AgentDir    string // host dir bind-mounted read-only at AgentMount; optional
	// PidsCgroup is a host pids cgroup dir bind-mounted read-write at
	// PidsMount, for the agent to start processes in (see
	// internal/sandbox); it must be inside the container's own cgroup.
	PidsCgroup     string
	ReadonlyRootfs bool
	// Runtime is the runtime the spec is for; "runsc" grants the agent
	// agentCaps, which only gVisor's pids limit needs.
	Runtime string
	// Capabilities, if set, is PID 1's capability set instead of
	// Capabilities(Runtime): a restore must have the set its checkpoint
	// was made with.
	Capabilities []string
	// NetNS is the path of an existing network namespace to join (the
	// sandbox's own, made by internal/network); "" makes a new one with
	// loopback only. runsc uses its interfaces (--network=sandbox).
	NetNS string
	// Binds are host directories mounted into the sandbox (volumes).
	Binds []Bind
}

// Bind mounts the host directory Source at Destination in the sandbox,
// read-only if ReadOnly; never with set-uid bits or device nodes honoured.
type Bind struct {
	Source, Destination string
	ReadOnly            bool
}

// defaultCaps is what a sandbox's root keeps: Docker's default set less
// CAP_NET_RAW (raw and packet sockets: forged packets, sniffing),
// CAP_MKNOD (device nodes; the device cgroup denies them anyway) and
// CAP_SETFCAP (setting file capabilities; without it root cannot map
// itself into a new user namespace either). Like
// Docker's, it has no SYS_ADMIN (mount), SYS_MODULE, SYS_PTRACE,
// NET_ADMIN, SYS_TIME, ... Each one kept is what root in a template needs
// (docs/security.md): the agent's privilege drops and kills, apt-get and
// dpkg, chown, sudo and su, servers on ports below 1024.
var defaultCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

// Capabilities returns the capability set of PID 1 of a sandbox on
// runtime: what a checkpoint depends on (a restore must have the set the
// checkpoint was made with).
func Capabilities(runtime string) []string {
	caps := append([]string(nil), defaultCaps...)
	if runtime == "runsc" {
		caps = append(caps, agentCaps...)
	}
	return caps
}

// LegacyCapabilities is the set every sandbox had before Kiln dropped
// NET_RAW, MKNOD and SETFCAP and gave the runsc agent SYS_RESOURCE, in its
// order: the set of checkpoints made then, which record none.
var LegacyCapabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

// SpecCapabilities returns the capability set of s's process (its
// bounding set), or nil.
func SpecCapabilities(s *specs.Spec) []string {
	if s == nil || s.Process == nil || s.Process.Capabilities == nil {
		return nil
	}
	return append([]string(nil), s.Process.Capabilities.Bounding...)
}

// sysctls are set in the sandbox's own network namespace: ping works
// without CAP_NET_RAW through unprivileged ICMP sockets, for every group.
var sysctls = map[string]string{
	"net.ipv4.ping_group_range": "0 2147483647",
}

// agentCaps are granted to the agent under runsc on top of defaultCaps
// and never reach what it runs: it drops them from its bounding set at
// start. CAP_SYS_RESOURCE exempts the agent's own threads from the
// RLIMIT_NPROC that enforces the pids limit inside gVisor
// (internal/agent/process, sentryPids); the sentry grants it whatever the
// host's root holds, runc could not on a host whose root lacks it.
var agentCaps = []string{"CAP_SYS_RESOURCE"}

// NewSpec builds the spec for a sandbox: the process runs as root (it is
// kiln-agent, PID 1, which drops privileges for user commands) with
// defaultCaps, without no-new-privileges (a setuid binary such as sudo
// makes a user root, with at most those capabilities), fresh pid, ipc,
// uts, mount and network namespaces (loopback only), cgroup limits and,
// for runc, a seccomp deny list (gVisor ignores it and filters on its
// own; runc installs it before dropping capabilities, as it must without
// no-new-privileges).
func NewSpec(o SpecOptions) *specs.Spec {
	env := o.Env
	if !hasKey(env, "PATH") {
		env = append([]string{DefaultPath}, env...)
	}
	cwd := o.Cwd
	if cwd == "" {
		cwd = "/"
	}
	caps := Capabilities(o.Runtime)
	if o.Capabilities != nil {
		caps = append([]string(nil), o.Capabilities...)
	}
	s := &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			Args: append([]string(nil), o.Args...),
			Env:  env,
			Cwd:  cwd,
			User: specs.User{UID: 0, GID: 0},
			Capabilities: &specs.LinuxCapabilities{
				Bounding: caps, Effective: caps, Permitted: caps,
			},
			Rlimits: []specs.POSIXRlimit{
				{Type: "RLIMIT_NOFILE", Hard: nofile(), Soft: nofile()},
			},
			// No no_new_privs: setuid binaries (sudo) work, so the user
			// can become root in its own sandbox, as the API already lets
			// callers; the bounding set, seccomp and namespaces bound root
			// (docs/security.md).
			NoNewPrivileges: false,
		},
		Root:     &specs.Root{Path: o.Rootfs, Readonly: o.ReadonlyRootfs},
		Hostname: o.Hostname,
		Mounts:   defaultMounts(),
		Linux: &specs.Linux{
			Sysctl:      maps.Clone(sysctls),
			CgroupsPath: o.CgroupsPath,
			Resources:   resources(o.Limits),
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.MountNamespace},
				{Type: specs.NetworkNamespace, Path: o.NetNS},
			},
			MaskedPaths: []string{
				"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys",
				"/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats",
				"/proc/sched_debug", "/sys/firmware", "/proc/scsi",
			},
			ReadonlyPaths: []string{
				"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
			},
			Seccomp: seccompProfile(),
		},
	}
	if o.AgentDir != "" {
		s.Mounts = append(s.Mounts, specs.Mount{
			Destination: AgentMount, Type: "bind", Source: o.AgentDir,
			Options: []string{"rbind", "ro", "nosuid", "nodev"},
		})
	}
	if o.PidsCgroup != "" {
		s.Mounts = append(s.Mounts, specs.Mount{
			Destination: PidsMount, Type: "bind", Source: o.PidsCgroup,
			Options: []string{"bind", "rw", "nosuid", "nodev", "noexec"},
		})
	}
	for _, b := range o.Binds {
		mode := "rw"
		if b.ReadOnly {
			mode = "ro"
		}
		s.Mounts = append(s.Mounts, specs.Mount{
			Destination: b.Destination, Type: "bind", Source: b.Source,
			Options: []string{"rbind", mode, "nosuid", "nodev"},
		})
	}
	return s
}

func resources(l Limits) *specs.LinuxResources {
	r := &specs.LinuxResources{
		Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
	}
	if l.MemoryBytes > 0 {
		limit := l.MemoryBytes
		r.Memory = &specs.LinuxMemory{Limit: &limit, Swap: &limit}
	}
	if l.CPUs > 0 {
		quota, period := int64(l.CPUs*cfsPeriod), uint64(cfsPeriod)
		r.CPU = &specs.LinuxCPU{Quota: &quota, Period: &period}
	}
	if l.Pids > 0 {
		r.Pids = &specs.LinuxPids{Limit: l.Pids}
	}
	return r
}

// defaultMounts are the mounts `runc spec` emits.
func defaultMounts() []specs.Mount {
	return []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs",
			Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts",
			Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm",
			Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue",
			Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs",
			Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup",
			Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
	}
}

// nofile is the sandbox's open-file limit: 65536, capped at our own hard
// limit, which the runtime inherits and cannot raise without
// CAP_SYS_RESOURCE (runc fails the create otherwise).
func nofile() uint64 {
	const want = 1 << 16
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err == nil && r.Max < want {
		return r.Max
	}
	return want
}

func hasKey(env []string, key string) bool {
	for _, kv := range env {
		if len(kv) > len(key) && kv[:len(key)] == key && kv[len(key)] == '=' {
			return true
		}
	}
	return false
}
