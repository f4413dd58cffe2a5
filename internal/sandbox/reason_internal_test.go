package sandbox

import (
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/kiln-sh/kiln/internal/config"
)

// TestShortReason: a failure reason is one short line without host
// paths or another sandbox's id, however the failure was described.
func TestShortReason(t *testing.T) {
	m := &Manager{cfg: Config{Config: config.Config{DataDir: "/var/lib/kiln", RunDir: "/run/kiln"}, StateDir: "/srv/state"}}
	const own, warm = ID("abcdefghij0123456789"), "zyxwvutsrq9876543210"
	dump := make([]byte, 64<<10)
	dump = dump[:runtime.Stack(dump, true)]
	for _, tc := range []struct {
		name, in, want string
	}{
		{"plain", "timeout expired", "timeout expired"},
		{"stack dump", "sandbox exited unexpectedly (agent: SIGQUIT: quit)\nPC=0x4711 m=0 sigcode=0\n\n" + string(dump),
			"sandbox exited unexpectedly (agent: SIGQUIT: quit)"},
		{"host paths", "resuming: restoring container: open /var/lib/kiln/sandboxes/x/checkpoint/checkpoint.img: no such file",
			"resuming: restoring container: open …/sandboxes/x/checkpoint/checkpoint.img: no such file"},
		{"ids", "restoring " + own.String() + " from the warm checkpoint of " + warm + " failed",
			"restoring " + own.String() + " from the warm checkpoint of … failed"},
		{"words are not ids", "sandboxexitedunexpectedly", "sandboxexitedunexpectedly"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := m.shortReason(own, tc.in); got != tc.want {
				t.Errorf("shortReason = %q, want %q", got, tc.want)
			}
		})
	}
	long := m.shortReason(own, strings.Repeat("€", 1000))
	if len(long) > maxReason+len("…") || !strings.HasSuffix(long, "…") {
		t.Errorf("a long reason is %d bytes: %q", len(long), long)
	}
}

// TestAgentCrash: of a Go crash in the agent's log, the reason keeps the
// line that says why; the rest is for the server log.
func TestAgentCrash(t *testing.T) {
	dir := t.TempDir()
	if line, tail := agentCrash(dir); line != "" || tail != "" {
		t.Errorf("no log: %q, %q", line, tail)
	}
	dump := make([]byte, 64<<10)
	dump = dump[:runtime.Stack(dump, true)]
	log := "time=x level=INFO msg=\"agent started\"\n" + strings.Repeat("time=x level=DEBUG msg=exec\n", 5000) +
		"SIGABRT: abort\nPC=0x47a1c1 m=0 sigcode=0\n\n" + string(dump) + "\n\tpanic: nested\n"
	if err := os.WriteFile(filepath.Join(dir, agentLog), []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	line, tail := agentCrash(dir)
	if line != "SIGABRT: abort" || tail == "" {
		t.Errorf("crash line %q (tail %d bytes)", line, len(tail))
	}
}

// TestLimitsNoOverflow: the largest integers are refused with their own
// value in the message, not a wrapped negative one.
func TestLimitsNoOverflow(t *testing.T) {
	cfg := config.FromEnv().Limits
	for _, tc := range []struct {
		name string
		req  Limits
		want string
	}{
		{"disk", Limits{DiskBytes: math.MaxInt64}, "disk of " + strconv.FormatInt(math.MaxInt64, 10) + " bytes"},
		{"memory", Limits{MemoryBytes: math.MaxInt64}, "memory of " + strconv.FormatInt(math.MaxInt64, 10) + " bytes"},
		{"pids", Limits{Pids: math.MaxInt64}, "pids " + strconv.FormatInt(math.MaxInt64, 10)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := limitsFor(tc.req, Limits{}, cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "-") {
				t.Errorf("limitsFor: %v, want %q", err, tc.want)
			}
		})
	}
}
