package oci

import (
	"context"
	"os/exec"
	"regexp"
)

// modernRunsc is the first gVisor release date (YYYYMMDD) whose runsc
// Kiln drives with its modern flags: the systrap platform, --overlay2, and
// a statx that accepts AT_NO_AUTOMOUNT (Debian bookworm's coreutils need
// it; Debian's own runsc, 20221219, rejects it, so `ls -l` fails inside).
const modernRunsc = "20230601"

var runscDateRE = regexp.MustCompile(`(?m)^runsc version \D*(\d{8})`)

// RunscFlags probes a runsc binary's version and returns the global flags
// Kiln uses with it: on a modern runsc the systrap platform (syscalls are
// several times faster than ptrace) and --overlay2=none (the sandbox's
// root is already a writable host overlay whose size is the disk limit);
// on an old one ptrace, the one platform that works there (KVM is nested
// here and hangs). A platform other than "" overrides the choice.
func RunscFlags(ctx context.Context, binary, platform string) []string {
	out, _ := exec.CommandContext(ctx, binary, "--version").Output()
	modern := false
	if m := runscDateRE.FindSubmatch(out); m != nil {
		modern = string(m[1]) >= modernRunsc
	}
	switch {
	case platform != "":
	case modern:
		platform = "systrap"
	default:
		platform = "ptrace"
	}
	flags := []string{"--platform=" + platform}
	if modern {
		flags = append(flags, "--overlay2=none")
	}
	return flags
}
