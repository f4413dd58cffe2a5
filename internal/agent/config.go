package agent

import (
	"fmt"
	"log/slog"
	"strconv"
	"strings"

	"github.com/kiln-sh/kiln/internal/agent/process"
)

// Config is kiln-agent's configuration. The host sets it through the
// sandbox's environment (the OCI spec's process.env):
//
//	KILN_SANDBOX_ID       the sandbox's id, for logs; processes and kernels
//	                      see it too (the one KILN_* variable they do)
//	KILN_MEMORY_LIMIT     the sandbox's memory limit in bytes (0: unknown);
//	                      named in out-of-memory exit messages
//	KILN_OOM_GUARD        1/true: run the userspace OOM guard (for gVisor,
//	                      where the host cgroup would kill the whole sandbox);
//	                      needs KILN_MEMORY_LIMIT
//	KILN_PIDS_LIMIT       if set, the guard kills the process tree with the
//	                      most tasks when the sandbox exceeds this many
//	                      tasks (for gVisor, whose host pids limit would
//	                      kill the whole sandbox)
//	KILN_PIDS_CGROUP      tasks file of the pids cgroup to start processes in
//	                      (runc: the host mounts it; see process.forker)
//	KILN_OUTPUT_LIMIT     default cap on one process's stdout+stderr bytes
//	                      (16 MiB)
//	KILN_REPLAY_BYTES     per-process replay buffer for re-attaching (1 MiB)
//	KILN_PROCESS_HISTORY  ended processes remembered for attach and list (64)
//	KILN_LOG_LEVEL        debug, info (default), warn or error
//	KILN_CODE_HEALTH      the address to answer E2B's code-interpreter
//	                      health check on (GET /health), or "off"; by
//	                      default 0.0.0.0:49999 in a sandbox whose root
//	                      filesystem has ipykernel (see CodePort)
//
// Every other KILN_* variable is removed from the environment that
// processes inherit (BaseEnv). A restored agent learns its new id and
// environment from the host (wire.MethodIdentify).
type Config struct {
	SandboxID   string
	MemoryLimit int64
	OOMGuard    bool
	PidsLimit   int64
	PidsCgroup  string
	OutputLimit int64
	ReplayBytes int64
	History     int
	LogLevel    slog.Level
	// CodeHealth is the address of the code interpreter's health check
	// ("": none).
	CodeHealth string
	// BaseEnv is the agent's environment without KILN_* variables: the
	// sandbox's environment, which processes inherit.
	BaseEnv []string
	// MemoryUsage reads the sandbox's memory use, for admitting kernels;
	// nil: process.MemoryUsage. Not from the environment (tests).
	MemoryUsage func() (int64, error)
	// PathDir, if set, goes first on the PATH of every process and
	// kernel: the dir of the sudo client (package sudo). Not from the
	// environment: cmd/kiln-agent sets it.
	PathDir string
	// SudoSocket, if set, is where ServeSudo listens (sudo.SocketPath).
	// Not from the environment: cmd/kiln-agent sets it as PID 1.
	SudoSocket string
	// HostsFile, if set, is the hosts file a restored agent renames its
	// hostname in (renameHosts). Not from the environment: cmd/kiln-agent
	// sets it as PID 1.
	HostsFile string
	// ReapAll makes the agent reap every child with wait4(-1). Not from
	// the environment: cmd/kiln-agent sets it (the agent is PID 1 or a
	// child subreaper there); an agent embedded in a program that has
	// other children (tests) leaves it false.
	ReapAll bool
}

// Default returns the configuration with no variables set.
func Default() Config {
	return Config{
		OutputLimit: process.DefaultOutputLimit,
		ReplayBytes: process.DefaultReplayBytes,
		History:     process.DefaultHistory,
		LogLevel:    slog.LevelInfo,
	}
}

// ConfigFromEnv reads the configuration from an environment list such as
// os.Environ().
func ConfigFromEnv(environ []string) (Config, error) {
	c := Default()
	codeHealthSet := false
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(k, "KILN_") {
			c.BaseEnv = append(c.BaseEnv, kv)
			continue
		}
		var err error
		switch k {
		case "KILN_SANDBOX_ID":
			c.SandboxID = v
		case "KILN_MEMORY_LIMIT":
			c.MemoryLimit, err = parseBytes(v)
		case "KILN_OOM_GUARD":
			c.OOMGuard, err = strconv.ParseBool(v)
		case "KILN_PIDS_CGROUP":
			c.PidsCgroup = v
		case "KILN_PIDS_LIMIT":
			c.PidsLimit, err = strconv.ParseInt(v, 10, 64)
		case "KILN_OUTPUT_LIMIT":
			c.OutputLimit, err = parseBytes(v)
		case "KILN_REPLAY_BYTES":
			c.ReplayBytes, err = parseBytes(v)
		case "KILN_PROCESS_HISTORY":
			c.History, err = strconv.Atoi(v)
		case "KILN_CODE_HEALTH":
			c.CodeHealth = v
			codeHealthSet = true
		case "KILN_LOG_LEVEL":
			err = c.LogLevel.UnmarshalText([]byte(v))
		}
		if err != nil {
			return Config{}, fmt.Errorf("parsing %s=%q: %w", k, v, err)
		}
	}
	switch {
	case !codeHealthSet:
		c.CodeHealth = defaultCodeHealth()
	case c.CodeHealth == "off":
		c.CodeHealth = ""
	}
	return c, c.Validate()
}

func (c Config) memoryUsage() func() (int64, error) {
	if c.MemoryUsage != nil {
		return c.MemoryUsage
	}
	return process.MemoryUsage
}

// Validate checks the configuration.
func (c Config) Validate() error {
	switch {
	case c.MemoryLimit < 0:
		return fmt.Errorf("KILN_MEMORY_LIMIT must not be negative")
	case c.OOMGuard && c.MemoryLimit == 0:
		return fmt.Errorf("KILN_OOM_GUARD needs KILN_MEMORY_LIMIT")
	case c.OutputLimit <= 0:
		return fmt.Errorf("KILN_OUTPUT_LIMIT must be positive")
	case c.ReplayBytes < 64<<10:
		return fmt.Errorf("KILN_REPLAY_BYTES must be at least 64 KiB")
	case c.History < 1:
		return fmt.Errorf("KILN_PROCESS_HISTORY must be at least 1")
	}
	return nil
}

func parseBytes(s string) (int64, error) {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("want a number of bytes: %w", err)
	}
	return n, nil
}
