package oci

import (
	"syscall"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// deniedSyscalls fail with EPERM under runc. Most already need capabilities
// the sandbox lacks; the filter is a second wall against kernel bugs
// reachable through them. ptrace and process_vm_* are denied too (Docker
// allows them): debuggers inside sandboxes are not worth the surface.
var deniedSyscalls = []string{
	// mounts and root changes
	"mount", "umount", "umount2", "pivot_root", "move_mount", "open_tree",
	"fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
	// kernel modules, kexec, reboot
	"init_module", "finit_module", "delete_module", "create_module",
	"kexec_load", "kexec_file_load", "reboot",
	// large attack surfaces
	"bpf", "perf_event_open", "userfaultfd", "io_uring_setup",
	"io_uring_enter", "io_uring_register",
	// kernel keyring
	"keyctl", "add_key", "request_key",
	// other processes' memory
	"ptrace", "process_vm_readv", "process_vm_writev", "kcmp",
	// host-wide state
	"swapon", "swapoff", "acct", "quotactl", "syslog", "settimeofday",
	"clock_settime", "clock_adjtime", "adjtimex", "stime", "vhangup",
	"iopl", "ioperm", "lookup_dcookie", "nfsservctl", "uselib", "_sysctl",
	"get_kernel_syms", "query_module",
	// namespaces and handles
	"setns", "open_by_handle_at", "name_to_handle_at",
}

// seccompProfile allows everything but deniedSyscalls, user-namespace
// creation via clone/unshare (the usual privilege-escalation path), and
// clone3, whose flags a filter cannot read (ENOSYS makes libc fall back
// to clone). All three x86 ABIs are listed so 32-bit entry points are
// filtered too; runc skips names libseccomp does not know.
func seccompProfile() *specs.LinuxSeccomp {
	eperm, enosys := uint(syscall.EPERM), uint(syscall.ENOSYS)
	newUser := []specs.LinuxSeccompArg{{
		Index: 0, Value: syscall.CLONE_NEWUSER, ValueTwo: syscall.CLONE_NEWUSER,
		Op: specs.OpMaskedEqual,
	}}
	return &specs.LinuxSeccomp{
		DefaultAction: specs.ActAllow,
		Architectures: []specs.Arch{specs.ArchX86_64, specs.ArchX86, specs.ArchX32},
		Syscalls: []specs.LinuxSyscall{
			{Names: deniedSyscalls, Action: specs.ActErrno, ErrnoRet: &eperm},
			{Names: []string{"clone", "unshare"}, Action: specs.ActErrno, ErrnoRet: &eperm, Args: newUser},
			{Names: []string{"clone3"}, Action: specs.ActErrno, ErrnoRet: &enosys},
		},
	}
}
