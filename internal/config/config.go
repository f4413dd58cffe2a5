// Package config holds the one configuration struct of the kiln binary:
// defaults, then environment, then flags, then Validate. It is the only
// package that reads the environment.
package config

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Config configures kiln serve, kiln run and the other subcommands.
type Config struct {
	DataDir   string // templates, sandboxes, agent cache (KILN_DATA_DIR)
	RunDir    string // runtime state roots (KILN_RUN_DIR)
	Runtime   string // default runtime: runsc or runc (KILN_RUNTIME)
	RunscPath string // KILN_RUNSC
	RuncPath  string // KILN_RUNC
	// RunscPlatform is gVisor's platform; "" picks systrap on a modern
	// runsc and ptrace on Debian's (KVM is nested PVM here and hangs).
	RunscPlatform string
	// RunscExtraFlags are more global runsc flags, e.g. "--directfs=false"
	// (KILN_RUNSC_FLAGS, space-separated).
	RunscExtraFlags []string
	AgentPath       string // kiln-agent binary (KILN_AGENT); default next to kiln
	Mirror          string // Debian mirror for template builds (KILN_MIRROR)
	// ResumeReady makes a paused runsc sandbox keep a container created
	// from its bundle but not started (its sandbox and gofer processes,
	// no application memory), so that its resume restores into it and
	// skips their spawn; it costs each paused sandbox those processes
	// (KILN_RESUME_READY=1; default off: a paused sandbox holds nothing).
	ResumeReady    bool
	resumeReadyErr error // a malformed KILN_RESUME_READY, for Validate

	Limits   Limits
	Server   Server
	Network  Network
	Liveness Liveness
	// Cluster is kiln serve's role and, for fronts and nodes, the
	// cluster's settings (cluster.go).
	Cluster Cluster
}

// Liveness configures the host's liveness ping of each running sandbox's
// agent: a sandbox whose agent leaves Misses pings in a row unanswered,
// each within Interval, is failed ("agent unresponsive") and destroyed,
// e.g. after code in it sent the agent SIGSTOP.
type Liveness struct {
	// Interval between pings, and each ping's deadline
	// (KILN_AGENT_PING_INTERVAL, default 2s; 0 turns the ping off).
	Interval time.Duration
	// Misses is how many unanswered pings in a row fail the sandbox
	// (KILN_AGENT_PING_MISSES, default 5).
	Misses int
	// MaxRate bounds the pings per second of all sandboxes together
	// (KILN_AGENT_PING_MAX_RATE, default 100; 0: no bound): with more than
	// MaxRate × Interval running, each is pinged less often, so that
	// idle sandboxes' pings (each wakes a sandbox's agent and its
	// Sentry) cost the host about the same at any count (a fixed share
	// of a core), and an unresponsive agent is found later.
	MaxRate float64
}

// Network configures sandbox networking (internal/network, docs/networking.md).
type Network struct {
	// Setup says whether kiln serve sets up sandbox networking on this
	// host (KILN_NETWORK, --network): IP forwarding, an nftables table
	// "kiln" and the Kiln DNS resolver. NetworkAuto ("" too) sets it up
	// where the host can and otherwise runs without; NetworkOn fails
	// startup if it cannot; NetworkOff never sets it up. Without it every
	// sandbox has loopback only.
	Setup string
	// DefaultMode is the network of sandboxes whose create request and
	// template do not choose one: "none" or "nat" (KILN_NETWORK_DEFAULT);
	// "" is nat when networking is up, else none.
	DefaultMode string
	// Pool is the IPv4 range of the sandboxes' outer links, one /30 each
	// (KILN_NETWORK_POOL, default 10.200.0.0/16); it must not overlap the
	// host's networks.
	Pool string
	// DNS are the upstream resolvers, ip[:port] (KILN_NETWORK_DNS,
	// space-separated; default the host's /etc/resolv.conf).
	DNS []string
	// HostNS runs the host side in a named network namespace instead of
	// kiln's own (KILN_NETWORK_HOST_NS; tests and special setups).
	HostNS string
}

// Server configures kiln serve.
type Server struct {
	Listen string // address of the HTTP API (KILN_LISTEN)
	// Store names the storage backend (KILN_STORE): "" or "sqlite" for
	// DataDir/kiln.db, "sqlite:/abs/path", or "postgres://…".
	Store string
	// Per-key quotas for keys that set none (KILN_MAX_SANDBOXES,
	// KILN_MAX_MEMORY).
	DefaultMaxSandboxes   int
	DefaultMaxMemoryBytes int64
	// Volumes (internal/volume): the largest one, and the most one key's
	// volumes may hold together; 0 takes internal/volume's defaults.
	VolumeMaxBytes, VolumeQuotaBytes int64
	// ShutdownGrace is how long in-flight requests and streams may run on
	// after SIGTERM before their contexts are cancelled
	// (KILN_SHUTDOWN_GRACE).
	ShutdownGrace time.Duration
	// Pools are the sizes of the pools of ready sandboxes per template
	// (KILN_POOL, e.g. "code-interpreter=2"; default none).
	Pools    Pools
	poolsErr error // a malformed KILN_POOL, for Validate
	// PoolBursts are how far demand may grow each pool (KILN_POOL_BURST,
	// kiln serve --pool-burst, written as Pools): a pool keeps as many
	// ready sandboxes as creates asked it for in the last minute, between
	// its size and its burst size (docs/pools.md).
	PoolBursts    Pools
	poolBurstsErr error
	// Edge bounds slow and anonymous clients (edge.go).
	Edge Edge
	// Builds bounds template builds (builds.go).
	Builds Builds
	// Public is the sandboxes' domain and HTTPS (public.go).
	Public Public
}

// Limits are the server-wide defaults and ceilings for sandboxes.
type Limits struct {
	DefaultCPUs, MaxCPUs               float64
	DefaultMemoryBytes, MaxMemoryBytes int64
	DefaultDiskBytes, MaxDiskBytes     int64
	DefaultPids, MaxPids               int64
	DefaultCommandTimeout              time.Duration
	MaxCommandTimeout                  time.Duration
	DefaultOutputBytes, MaxOutputBytes int64
	// A sandbox lives this long unless its timeout is set or extended.
	DefaultSandboxTimeout, MaxSandboxTimeout time.Duration
	// MaxPausedLifetime is how long a sandbox may stay paused before it is
	// deleted, image and all (KILN_MAX_PAUSED; 0: forever).
	MaxPausedLifetime time.Duration
	// RetainEnded is how long the record of a stopped or failed sandbox
	// is kept (without its env and metadata) before it is deleted
	// (KILN_RETAIN_ENDED; must be positive).
	RetainEnded time.Duration
	// Snapshots one owner may keep: how many and how many bytes in total
	// (KILN_MAX_SNAPSHOTS, KILN_MAX_SNAPSHOT_BYTES; 0: unlimited).
	MaxSnapshots     int
	MaxSnapshotBytes int64
}

const (
	MiB = 1 << 20
	GiB = 1 << 30
)

// Default returns the built-in defaults.
func Default() Config {
	agent := "kiln-agent"
	if exe, err := os.Executable(); err == nil {
		agent = filepath.Join(filepath.Dir(exe), "kiln-agent")
	}
	return Config{
		DataDir:   "/var/lib/kiln",
		RunDir:    "/run/kiln",
		Runtime:   "runsc",
		RunscPath: runscPath(),
		RuncPath:  "runc",
		AgentPath: agent,
		Mirror:    "http://deb.debian.org/debian",
		Limits: Limits{
			DefaultCPUs: 1, MaxCPUs: float64(runtime.NumCPU()),
			DefaultMemoryBytes: 512 * MiB, MaxMemoryBytes: 16 * GiB,
			DefaultDiskBytes: 1 * GiB, MaxDiskBytes: 64 * GiB,
			DefaultPids: 512, MaxPids: 32768,
			DefaultCommandTimeout: 60 * time.Second, MaxCommandTimeout: 24 * time.Hour,
			DefaultOutputBytes: 16 * MiB, MaxOutputBytes: 1 * GiB,
			DefaultSandboxTimeout: 5 * time.Minute, MaxSandboxTimeout: 24 * time.Hour,
			MaxPausedLifetime: 7 * 24 * time.Hour,
			RetainEnded:       7 * 24 * time.Hour,
			MaxSnapshots:      50, MaxSnapshotBytes: 50 * GiB,
		},
		Network: Network{Setup: NetworkAuto},
		Server: Server{
			Listen:              "127.0.0.1:8420",
			DefaultMaxSandboxes: 100, DefaultMaxMemoryBytes: 64 * GiB,
			ShutdownGrace: 10 * time.Second,
		},
		Liveness: Liveness{Interval: 2 * time.Second, Misses: 5, MaxRate: 100},
		Cluster:  defaultCluster(),
	}
}

// ModernRunsc is where scripts/install-runsc.sh installs a recent, static
// gVisor runsc; Kiln prefers it to Debian's.
const ModernRunsc = "/usr/local/lib/kiln/runsc"

func runscPath() string {
	if _, err := os.Stat(ModernRunsc); err == nil {
		return ModernRunsc
	}
	return "runsc"
}

// FromEnv returns the defaults overridden by KILN_* environment variables.
func FromEnv() Config {
	c := Default()
	str := func(dst *string, key string) {
		if v := os.Getenv(key); v != "" {
			*dst = v
		}
	}
	str(&c.DataDir, "KILN_DATA_DIR")
	str(&c.RunDir, "KILN_RUN_DIR")
	str(&c.Runtime, "KILN_RUNTIME")
	str(&c.RunscPath, "KILN_RUNSC")
	str(&c.RuncPath, "KILN_RUNC")
	str(&c.RunscPlatform, "KILN_RUNSC_PLATFORM")
	if v := os.Getenv("KILN_RUNSC_FLAGS"); v != "" {
		c.RunscExtraFlags = strings.Fields(v)
	}
	str(&c.AgentPath, "KILN_AGENT")
	switch v := os.Getenv("KILN_RESUME_READY"); strings.ToLower(strings.TrimSpace(v)) {
	case "1", "true", "yes", "on":
		c.ResumeReady = true
	case "", "0", "false", "no", "off":
	default:
		c.resumeReadyErr = fmt.Errorf("KILN_RESUME_READY=%q: want 1 or 0 (true/false, yes/no, on/off)", v)
	}
	str(&c.Mirror, "KILN_MIRROR")
	str(&c.Server.Listen, "KILN_LISTEN")
	str(&c.Server.Store, "KILN_STORE")
	if v := os.Getenv("KILN_NETWORK"); v != "" {
		c.Network.Setup = ParseNetworkSetup(v)
	}
	str(&c.Network.DefaultMode, "KILN_NETWORK_DEFAULT")
	str(&c.Network.Pool, "KILN_NETWORK_POOL")
	str(&c.Network.HostNS, "KILN_NETWORK_HOST_NS")
	if v := os.Getenv("KILN_NETWORK_DNS"); v != "" {
		c.Network.DNS = strings.Fields(v)
	}
	// Malformed numbers are kept as invalid values for Validate to report.
	if v := os.Getenv("KILN_MAX_SANDBOXES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			n = -1
		}
		c.Server.DefaultMaxSandboxes = n
	}
	if v := os.Getenv("KILN_MAX_MEMORY"); v != "" {
		n, err := ParseBytes(v)
		if err != nil {
			n = -1
		}
		c.Server.DefaultMaxMemoryBytes = n
	}
	if v := os.Getenv("KILN_MAX_PAUSED"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			d = -1
		}
		c.Limits.MaxPausedLifetime = d
	}
	if v := os.Getenv("KILN_RETAIN_ENDED"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			d = -1
		}
		c.Limits.RetainEnded = d
	}
	if v := os.Getenv("KILN_MAX_SNAPSHOTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			n = -1
		}
		c.Limits.MaxSnapshots = n
	}
	if v := os.Getenv("KILN_MAX_SNAPSHOT_BYTES"); v != "" {
		n, err := ParseBytes(v)
		if err != nil {
			n = -1
		}
		c.Limits.MaxSnapshotBytes = n
	}
	if v := os.Getenv("KILN_AGENT_PING_INTERVAL"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			d = -1
		}
		c.Liveness.Interval = d
	}
	if v := os.Getenv("KILN_AGENT_PING_MISSES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			n = -1
		}
		c.Liveness.Misses = n
	}
	if v := os.Getenv("KILN_AGENT_PING_MAX_RATE"); v != "" {
		n, err := strconv.ParseFloat(v, 64)
		if err != nil {
			n = -1
		}
		c.Liveness.MaxRate = n
	}
	c.Server.Pools, c.Server.poolsErr = ParsePools(os.Getenv("KILN_POOL"))
	c.Server.PoolBursts, c.Server.poolBurstsErr = ParsePools(os.Getenv("KILN_POOL_BURST"))
	if v := os.Getenv("KILN_SHUTDOWN_GRACE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			d = -1
		}
		c.Server.ShutdownGrace = d
	}
	c.Server.Edge = edgeFromEnv(c.Server.Edge)
	c.Server.Builds = buildsFromEnv(c.Server.Builds)
	c.Server.Public = publicFromEnv(c.Server.Public)
	c.Cluster = clusterFromEnv(c.Cluster)
	return c
}

// Env returns an environment variable for the few callers outside config
// that need client-side settings (KILN_URL, KILN_API_KEY).
func Env(key string) string { return os.Getenv(key) }

// Validate reports the first setting that cannot work.
func (c *Config) Validate() error {
	var errs []error
	if !filepath.IsAbs(c.DataDir) {
		errs = append(errs, fmt.Errorf("data dir %q must be absolute", c.DataDir))
	}
	if !filepath.IsAbs(c.RunDir) {
		errs = append(errs, fmt.Errorf("run dir %q must be absolute", c.RunDir))
	}
	if c.Runtime != "runsc" && c.Runtime != "runc" {
		errs = append(errs, fmt.Errorf("runtime %q: want runsc or runc", c.Runtime))
	}
	l := c.Limits
	if l.DefaultCPUs <= 0 || l.DefaultCPUs > l.MaxCPUs {
		errs = append(errs, fmt.Errorf("default cpus %v outside (0, %v]", l.DefaultCPUs, l.MaxCPUs))
	}
	if l.DefaultMemoryBytes < 32*MiB || l.DefaultMemoryBytes > l.MaxMemoryBytes {
		errs = append(errs, errors.New("default memory must be at least 32 MiB and at most the maximum"))
	}
	if l.DefaultDiskBytes < 64*MiB || l.DefaultDiskBytes > l.MaxDiskBytes {
		errs = append(errs, errors.New("default disk must be at least 64 MiB and at most the maximum"))
	}
	if l.MaxPausedLifetime < 0 {
		errs = append(errs, errors.New("max paused lifetime (KILN_MAX_PAUSED) must be a duration such as 168h, or 0 for forever"))
	}
	if l.RetainEnded <= 0 {
		errs = append(errs, errors.New("retention of ended sandboxes (KILN_RETAIN_ENDED) must be a positive duration such as 168h"))
	}
	if l.MaxSnapshots < 0 || l.MaxSnapshotBytes < 0 {
		errs = append(errs, errors.New("snapshot limits (KILN_MAX_SNAPSHOTS, KILN_MAX_SNAPSHOT_BYTES) must be a count and a size such as 50G, or 0 for unlimited"))
	}
	if c.resumeReadyErr != nil {
		errs = append(errs, c.resumeReadyErr)
	}
	if c.Liveness.Interval < 0 || (c.Liveness.Interval > 0 && c.Liveness.Interval < 100*time.Millisecond) {
		errs = append(errs, errors.New("agent ping interval (KILN_AGENT_PING_INTERVAL) must be a duration of at least 100ms, or 0 for no ping"))
	}
	if !(c.Liveness.MaxRate >= 0) || math.IsInf(c.Liveness.MaxRate, 0) {
		errs = append(errs, errors.New("agent ping max rate (KILN_AGENT_PING_MAX_RATE) must be a number of pings per second, or 0 for no bound"))
	}
	if c.Liveness.Misses < 1 {
		errs = append(errs, errors.New("agent ping misses (KILN_AGENT_PING_MISSES) must be a positive number"))
	}
	errs = append(errs, c.Server.validate(), c.Network.validate(), c.Cluster.validate(c.Server.Store))
	return errors.Join(errs...)
}

// Settings of Network.Setup.
const (
	NetworkAuto = "auto"
	NetworkOn   = "on"
	NetworkOff  = "off"
)

// ParseNetworkSetup reads a KILN_NETWORK or --network value: auto, on or
// off, with the older boolean spellings (1, true, yes → on; 0, false,
// no → off). Anything else is kept as given for Validate to report.
func ParseNetworkSetup(v string) string {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "", NetworkAuto:
		return NetworkAuto
	case NetworkOn, "1", "true", "yes":
		return NetworkOn
	case NetworkOff, "0", "false", "no":
		return NetworkOff
	}
	return v
}

func (n Network) validate() error {
	switch n.Setup {
	case "", NetworkAuto, NetworkOn, NetworkOff:
	default:
		return fmt.Errorf("sandbox networking %q (KILN_NETWORK, --network): want auto, on or off", n.Setup)
	}
	switch n.DefaultMode {
	case "", "none":
	case "nat":
		if n.Setup == NetworkOff {
			return errors.New("default network nat (KILN_NETWORK_DEFAULT) needs sandbox networking (KILN_NETWORK is off)")
		}
	default:
		return fmt.Errorf("default network %q (KILN_NETWORK_DEFAULT): want none or nat", n.DefaultMode)
	}
	if n.Pool != "" {
		if p, err := netip.ParsePrefix(n.Pool); err != nil || !p.Addr().Is4() || p.Bits() > 29 {
			return fmt.Errorf("network pool %q (KILN_NETWORK_POOL): want an IPv4 prefix of /29 or larger", n.Pool)
		}
	}
	for _, d := range n.DNS {
		if _, err := netip.ParseAddrPort(d); err != nil {
			if _, err := netip.ParseAddr(d); err != nil {
				return fmt.Errorf("DNS server %q (KILN_NETWORK_DNS): want ip or ip:port", d)
			}
		}
	}
	return nil
}

func (s Server) validate() error {
	var errs []error
	if _, _, err := net.SplitHostPort(s.Listen); err != nil {
		errs = append(errs, fmt.Errorf("listen address %q: want host:port", s.Listen))
	}
	if s.DefaultMaxSandboxes < 1 {
		errs = append(errs, errors.New("default max sandboxes per key (KILN_MAX_SANDBOXES) must be a positive number"))
	}
	if s.DefaultMaxMemoryBytes < 64*MiB {
		errs = append(errs, errors.New("default max memory per key (KILN_MAX_MEMORY) must be a size of at least 64M"))
	}
	if s.poolsErr != nil {
		errs = append(errs, fmt.Errorf("KILN_POOL: %w", s.poolsErr))
	}
	if s.poolBurstsErr != nil {
		errs = append(errs, fmt.Errorf("KILN_POOL_BURST: %w", s.poolBurstsErr))
	}
	if s.ShutdownGrace < 0 {
		errs = append(errs, errors.New("shutdown grace (KILN_SHUTDOWN_GRACE) must be a duration such as 10s"))
	}
	errs = append(errs, s.Edge.validate(), s.Builds.validate(), s.Public.validate())
	return errors.Join(errs...)
}

// ParseBytes parses a size such as 512M, 2G, 1.5GiB or a plain byte count.
func ParseBytes(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   float64
	}{{"GiB", GiB}, {"MiB", MiB}, {"KiB", 1 << 10}, {"G", GiB}, {"M", MiB}, {"K", 1 << 10}, {"B", 1}}
	mult := 1.0
	for _, u := range units {
		if len(s) > len(u.suffix) && s[len(s)-len(u.suffix):] == u.suffix {
			s, mult = s[:len(s)-len(u.suffix)], u.mult
			break
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f < 0 {
		return 0, fmt.Errorf("size %q: want a number with an optional K, M or G suffix", s)
	}
	return int64(f * mult), nil
}
