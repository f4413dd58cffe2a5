package sandbox

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kiln-sh/kiln/internal/agentapi/channel"
	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/network"
	"github.com/kiln-sh/kiln/internal/oci"
	"github.com/kiln-sh/kiln/internal/rootfs"
	"github.com/kiln-sh/kiln/internal/template"
)

// Files in a sandbox's state dir.
const (
	stdinFIFO  = "agent.in"
	stdoutFIFO = "agent.out"
	agentLog   = "agent.log"
	layerDir   = "layer"
)

// agentBinary is the agent's path inside the sandbox.
const agentBinary = oci.AgentMount + "/kiln-agent"

// connectTimeout bounds the wait for a new agent's handshake.
const connectTimeout = 15 * time.Second

// Config configures a Manager.
type Config struct {
	config.Config
	// StateDir holds one directory per sandbox. kiln serve uses
	// DataDir/sandboxes; one-shot users (kiln run, tests) use their own so
	// they never touch the server's sandboxes.
	StateDir string
	// Adopt reconciles the store with this node's runtimes when the
	// Manager starts (after a restart of kiln serve): live sandboxes are
	// re-adopted, lost ones marked failed, orphans removed.
	Adopt bool
	// Store keeps the sandbox records; it is the source of truth for what
	// was acknowledged to clients.
	Store Store
	// Node names this host in records (default: the hostname).
	Node string
	// Net gives sandboxes of network mode nat their network; nil: only
	// mode none is available.
	Net *network.Network
	// Catalog finds the template a create names for its owner (custom
	// templates, public ones, built-ins) and a pinned build by id; nil:
	// the built-ins of DataDir only.
	Catalog *template.Catalog
	// Volumes binds the volumes a create asks for; nil: none can be.
	Volumes VolumeBinder
}

// catalog is how templates are found: Catalog, or DataDir's built-ins.
func (c Config) catalog() *template.Catalog {
	if c.Catalog != nil {
		return c.Catalog
	}
	return &template.Catalog{DataDir: c.DataDir}
}

// templateOf is the template a sandbox or snapshot record started from:
// its pinned build of a custom template, else the built-in name.
func (c Config) templateOf(name, build string) (*template.Template, error) {
	if build != "" {
		return c.catalog().Build(build)
	}
	return template.Lookup(c.DataDir, name)
}

// Manager creates, tracks and destroys the sandboxes of one host: the
// core. The checkpoint-image features are Images (images.go), which
// NewImages builds on a Manager.
type Manager struct {
	cfg      Config
	log      *slog.Logger
	runtimes map[string]oci.Runtime
	agentDir string

	store Store

	mu    sync.Mutex
	boxes map[ID]*box

	done      chan struct{} // closed by Close: stops the reaper
	closeOnce sync.Once

	images imageHooks // the image seam (below); guarded by mu

	// refusing, once set, is why Create refuses new sandboxes (Drain).
	refusing atomic.Pointer[string]

	// pingers counts the sandboxes whose agents are pinged (liveness).
	pingers atomic.Int64

	// specCaps, set by tests, replaces the capability set of new
	// sandboxes (to make images as an older Kiln did).
	specCaps []string

	// faults, set by tests, makes a stage of a bring-up path fail
	// (pipeline.go).
	faults func(path, stage string, id ID) error
}

// box is the live state of one sandbox.
type box struct {
	mu    sync.Mutex // serialises lifecycle changes of this sandbox
	rec   Sandbox
	dir   string
	conn  *channel.Conn
	procs *procs // the runtime's host processes, if this process started them
	// containerGone: a pause deleted the container (so a resume need not).
	containerGone bool
	// resumeReady: a paused runsc sandbox's container was created again,
	// not started (Config.ResumeReady): its resume restores into it.
	resumeReady bool
	// moved: a paused sandbox whose files are in the shared snapshot dir
	// only (move.go): nothing of it is on this host yet.
	moved bool
	// volumeDirs are the host directories of rec.Volumes, once bound.
	volumeDirs []string
	// ending is set when a destroy begins, before it closes the agent's
	// session: readable without mu, which the destroy holds while it
	// tears the sandbox down (Ending).
	ending atomic.Bool
}

// NewManager prepares the state dir and the agent binary and, if
// cfg.Adopt, re-adopts the sandboxes a previous process left running.
func NewManager(ctx context.Context, cfg Config, runtimes map[string]oci.Runtime, log *slog.Logger) (*Manager, error) {
	if cfg.StateDir == "" {
		cfg.StateDir = filepath.Join(cfg.DataDir, "sandboxes")
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating state dir: %w", err)
	}
	if _, ok := runtimes[cfg.Runtime]; !ok {
		return nil, fmt.Errorf("default runtime %q is not configured", cfg.Runtime)
	}
	if cfg.Store == nil {
		return nil, errors.New("sandbox manager needs a store")
	}
	if cfg.Node == "" {
		cfg.Node, _ = os.Hostname()
	}
	m := &Manager{cfg: cfg, log: log, runtimes: runtimes, boxes: make(map[ID]*box), store: cfg.Store,
		done: make(chan struct{}), images: noImages{}}
	if err := becomeSubreaper(); err != nil {
		log.Warn("cannot become child subreaper; destroying runsc sandboxes will be slow", "err", err)
	}
	var err error
	if m.agentDir, err = installAgent(cfg.AgentPath, cfg.DataDir); err != nil {
		return nil, err
	}
	if cfg.Adopt {
		if err := m.adopt(ctx); err != nil {
			return nil, err
		}
		m.pruneAgents()
	}
	go m.reaper()
	return m, nil
}

// installAgent copies the agent binary into DataDir/agent/<hash>/, so the
// bind mount of every sandbox keeps pointing at the same bytes even when
// the binary is rebuilt or kiln is upgraded.
func installAgent(src, dataDir string) (string, error) {
	b, err := os.ReadFile(src)
	if err != nil {
		return "", fmt.Errorf("reading agent binary (set KILN_AGENT): %w", err)
	}
	sum := sha256.Sum256(b)
	dir := filepath.Join(dataDir, "agent", hex.EncodeToString(sum[:8]))
	dst := filepath.Join(dir, "kiln-agent")
	// pids is the mount point of the user pids cgroup (oci.PidsMount).
	if err := os.MkdirAll(filepath.Join(dir, "pids"), 0o755); err != nil {
		return "", fmt.Errorf("creating agent dir: %w", err)
	}
	if err := linkSudo(dir); err != nil {
		return "", err
	}
	if _, err := os.Stat(dst); err == nil {
		// Installed again: pruneAgents keeps it for another agentGrace.
		now := time.Now()
		if err := os.Chtimes(dir, now, now); err != nil {
			return "", fmt.Errorf("touching agent dir: %w", err)
		}
		return dir, nil
	}
	tmp := dst + ".tmp" + strconv.Itoa(os.Getpid())
	if err := os.WriteFile(tmp, b, 0o755); err != nil {
		return "", fmt.Errorf("installing agent: %w", err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return "", fmt.Errorf("installing agent: %w", err)
	}
	return dir, nil
}

// linkSudo makes the agent dir's bin/sudo, a link to the agent: the agent
// puts bin first on the PATH of what it runs, and run as "sudo" it is the
// client of its own sudo broker (internal/agent/sudo), which works under
// gVisor where the template's setuid sudo cannot.
func linkSudo(dir string) error {
	link := filepath.Join(dir, "bin", "sudo")
	if target, err := os.Readlink(link); err == nil && target == "../kiln-agent" {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		return fmt.Errorf("creating agent dir: %w", err)
	}
	tmp := link + ".tmp" + strconv.Itoa(os.Getpid())
	_ = os.Remove(tmp)
	if err := os.Symlink("../kiln-agent", tmp); err != nil {
		return fmt.Errorf("linking sudo: %w", err)
	}
	if err := os.Rename(tmp, link); err != nil {
		return fmt.Errorf("linking sudo: %w", err)
	}
	return nil
}

// agentGrace is how long an agent build stays after it was last installed:
// another kiln serve (or test) on the same data dir may still run it.
const agentGrace = 24 * time.Hour

// pruneAgents removes the agent builds under DataDir/agent (15-20 MB each,
// one per kiln build ever run) that are not this Manager's, were last
// installed over agentGrace ago, and are not in the bundle of a sandbox
// dir of this node (a sandbox adopted from an older kiln still runs its
// build).
func (m *Manager) pruneAgents() {
	parent := filepath.Dir(m.agentDir)
	ents, err := os.ReadDir(parent)
	if err != nil {
		m.log.Warn("listing agent builds", "err", err)
		return
	}
	keep := map[string]bool{filepath.Base(m.agentDir): true}
	bundles, _ := filepath.Glob(filepath.Join(m.cfg.StateDir, "*", "config.json"))
	for _, path := range bundles {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		for _, e := range ents {
			dir := filepath.Join(parent, e.Name())
			if bytes.Contains(b, []byte(dir+`"`)) || bytes.Contains(b, []byte(dir+"/")) {
				keep[e.Name()] = true
			}
		}
	}
	for _, e := range ents {
		fi, err := e.Info()
		if keep[e.Name()] || !e.IsDir() || err != nil || time.Since(fi.ModTime()) < agentGrace {
			continue
		}
		if err := os.RemoveAll(filepath.Join(parent, e.Name())); err != nil {
			m.log.Warn("removing old agent build", "build", e.Name(), "err", err)
			continue
		}
		m.log.Info("removed old agent build", "build", e.Name(), "last_installed", fi.ModTime().UTC())
	}
}

// Create makes a sandbox and waits until its agent answers. A failure at
// any step unwinds everything made before it. A create from a snapshot,
// and one a pooled sandbox or a warm checkpoint can serve, goes through
// the image seam.
func (m *Manager) Create(ctx context.Context, opts CreateOptions) (Sandbox, error) {
	if why := m.refusing.Load(); why != nil {
		return Sandbox{}, fmt.Errorf("%s: %w", *why, errdefs.ErrUnavailable)
	}
	sb, err := m.create(ctx, opts)
	if err == nil && opts.AutoPause && opts.AutoPauseFiles {
		if err := m.markAutoPauseFiles(sb.ID); err != nil {
			if kerr := m.Kill(context.WithoutCancel(ctx), sb.ID); kerr != nil {
				m.log.Error("killing a sandbox whose create failed", "sandbox_id", sb.ID, "err", kerr)
			}
			return Sandbox{}, err
		}
	}
	return sb, err
}

func (m *Manager) create(ctx context.Context, opts CreateOptions) (_ Sandbox, err error) {
	images := m.imageSeam()
	if opts.Snapshot != "" {
		if len(opts.Volumes) > 0 {
			return Sandbox{}, fmt.Errorf("volumes: a sandbox from a snapshot cannot mount volumes: %w", errdefs.ErrInvalidArgument)
		}
		return images.fromSnapshot(ctx, opts)
	}
	if opts.Cold {
		images = noImages{} // neither a pooled sandbox nor a warm checkpoint
	}
	p, err := m.plan(ctx, opts)
	if err != nil {
		return Sandbox{}, err
	}
	b, rt, tmpl := p.b, p.rt, p.tmpl
	log := m.log.With("sandbox_id", b.rec.ID, "runtime", rt.Name())
	if len(b.rec.Volumes) == 0 { // pooled sandboxes have no volumes
		if sb, ok, err := images.claim(ctx, b.rec, p.net, tmpl, opts.Quota); ok || err != nil {
			return sb, err // a pooled sandbox (see pool.go), or a quota refusal
		}
	}

	var c cleanup
	defer func() {
		if err != nil {
			if uerr := c.unwind(ctx); uerr != nil {
				log.Error("unwinding failed create", "err", uerr)
			}
		}
	}()
	if err := m.enroll(ctx, pathBoot, b, &opts.Quota, &c); err != nil {
		return Sandbox{}, err
	}
	if err := m.bindVolumes(ctx, b); err != nil {
		return Sandbox{}, err
	}
	if err := m.attachNetwork(ctx, pathBoot, b, p.net, &c); err != nil {
		return Sandbox{}, err
	}
	t0 := time.Now()
	ck, why := images.warmCheckpoint(tmpl, rt, b.rec.Limits)
	if ck != nil && len(b.rec.Volumes) > 0 {
		// A warm checkpoint has the template's mounts, not these.
		ck, why = nil, "sandboxes with volumes boot cold"
	}
	conn, warm, err := m.launch(ctx, b, rt, tmpl, ck, why, false, &c)
	if err != nil {
		return Sandbox{}, err
	}
	if err := m.configureDNS(ctx, b.rec.ID, conn); err != nil {
		return Sandbox{}, err
	}
	rec, err := m.goLive(ctx, b, conn)
	if err != nil {
		return Sandbox{}, err
	}
	c.release()
	from := "boot"
	if warm {
		from = "warm checkpoint"
	}
	log.Info("sandbox created", "template", tmpl.Name, "from", from, "launch", time.Since(t0), "total", time.Since(rec.CreatedAt))
	return rec, nil
}

// createPlan is a validated create request, resolved against its
// template's defaults and the server's limits.
type createPlan struct {
	b    *box // record in state creating, not stored yet
	rt   oci.Runtime
	tmpl *template.Template
	net  *NetworkOptions // nil: mode none
}

// plan validates a create request (runtime, env, metadata, timeout,
// template, limits, network) before anything is made.
func (m *Manager) plan(ctx context.Context, opts CreateOptions) (createPlan, error) {
	if opts.Template == "" {
		opts.Template = "base"
	}
	if opts.Runtime == "" {
		opts.Runtime = m.cfg.Runtime
	}
	rt, ok := m.runtimes[opts.Runtime]
	if !ok {
		return createPlan{}, fmt.Errorf("runtime %q: %w (want one of %s)", opts.Runtime, errdefs.ErrInvalidArgument, strings.Join(slices.Sorted(maps.Keys(m.runtimes)), ", "))
	}
	if err := validateRecordVars(opts.Env, opts.Metadata); err != nil {
		return createPlan{}, err
	}
	timeout, err := m.cfg.timeout(opts.Timeout)
	if err != nil {
		return createPlan{}, err
	}
	tmpl := opts.TemplateBuild
	if tmpl == nil {
		if tmpl, err = m.cfg.catalog().Resolve(ctx, opts.Owner, opts.Template); err != nil {
			return createPlan{}, err
		}
	}
	d := tmpl.Defaults
	limits, err := limitsFor(opts.Limits, Limits{CPUs: d.CPUs, MemoryBytes: d.MemoryBytes, DiskBytes: d.DiskBytes}, m.cfg.Limits)
	if err != nil {
		return createPlan{}, err
	}
	env := maps.Clone(d.Env)
	if env == nil {
		env = map[string]string{}
	}
	maps.Copy(env, opts.Env)
	netOpts, err := m.resolveNetwork(opts.Network, d.Network)
	if err != nil {
		return createPlan{}, err
	}
	if err := m.checkVolumes(opts); err != nil {
		return createPlan{}, err
	}
	id := NewID()
	now := time.Now().UTC()
	b := &box{dir: filepath.Join(m.cfg.StateDir, id.String()), rec: Sandbox{
		ID: id, Template: tmpl.Name, Build: tmpl.Build, Runtime: rt.Name(), State: StateCreating,
		Limits: limits, User: d.User, Workdir: d.Workdir, Env: env,
		Metadata: opts.Metadata, Owner: opts.Owner, Node: m.cfg.Node,
		CreatedAt: now, ExpiresAt: now.Add(timeout), Timeout: timeout, AutoPause: opts.AutoPause,
		AutoResume: opts.AutoResume, Volumes: slices.Clone(opts.Volumes),
	}}
	return createPlan{b: b, rt: rt, tmpl: tmpl, net: netOpts}, nil
}

// start creates and starts the container with the agent's stdio on two
// FIFOs in the sandbox dir. The container holds both read-write, so it
// never sees EOF or EPIPE while kiln serve restarts; we re-open them by
// path.
func (m *Manager) start(ctx context.Context, rt oci.Runtime, id ID, b *oci.Bundle) error {
	if err := m.createContainer(ctx, rt, id, b); err != nil {
		return err
	}
	if err := rt.Start(ctx, id.String()); err != nil {
		return fmt.Errorf("starting container: %w", err)
	}
	return nil
}

// createContainer creates container id from b, not started, with the agent's
// stdio on the FIFOs in b's dir (see start).
func (m *Manager) createContainer(ctx context.Context, rt oci.Runtime, id ID, b *oci.Bundle) error {
	files, err := openStdio(b.Dir)
	if err != nil {
		return err
	}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	if err := rt.Create(ctx, id.String(), b, oci.IO{Stdin: files[0], Stdout: files[1], Stderr: files[2]}); err != nil {
		// The runtime's own stderr is the container's: the agent log.
		return fmt.Errorf("creating container: %w%s", err, agentLogTail(b.Dir))
	}
	return nil
}

// connect opens a new channel session on a sandbox's agent FIFOs; fresh
// says no session used them before.
func connect(ctx context.Context, dir string, fresh bool) (*channel.Conn, error) {
	// Non-blocking opens: the read end succeeds at once, and the write end
	// fails with ENXIO instead of hanging if the agent is gone.
	out, err := os.OpenFile(filepath.Join(dir, stdoutFIFO), os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("opening agent output: %w", err)
	}
	in, err := os.OpenFile(filepath.Join(dir, stdinFIFO), os.O_WRONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		out.Close()
		return nil, fmt.Errorf("opening agent input: %w", err)
	}
	if fresh {
		return channel.ConnectFresh(ctx, out, in)
	}
	return channel.Connect(ctx, out, in)
}

// agentEnv is the agent's environment: its own settings (KILN_*, which it
// strips from what commands see) and the sandbox's env for commands.
func (m *Manager) agentEnv(s Sandbox) []string {
	env := []string{
		"KILN_SANDBOX_ID=" + s.ID.String(),
		"KILN_MEMORY_LIMIT=" + strconv.FormatInt(s.Limits.MemoryBytes, 10),
		"KILN_OUTPUT_LIMIT=" + strconv.FormatInt(m.cfg.Limits.DefaultOutputBytes, 10),
	}
	// See runtimeLimits for who enforces which limit.
	if s.Runtime == "runsc" {
		env = append(env, "KILN_OOM_GUARD=1", "KILN_PIDS_LIMIT="+strconv.FormatInt(s.Limits.Pids, 10))
	} else {
		env = append(env, "KILN_PIDS_CGROUP="+oci.PidsMount+"/tasks")
	}
	for _, k := range slices.Sorted(maps.Keys(s.Env)) {
		env = append(env, k+"="+s.Env[k])
	}
	return env
}

// runtimeLimits are the cgroup limits given to the runtime. The agent
// (PID 1, a Go program) needs threads of its own, and the Go runtime dies
// when it cannot create one, so the sandbox's pids limit must not starve
// it:
//   - runc: the container's cgroup gets 64 tasks of headroom, and the
//     sandbox's own limit sits on a child cgroup that the agent starts every
//     process in (see userPidsCgroup and the agent's forker), so a fork
//     bomb gets EAGAIN from the kernel and the agent lives on. The kernel's
//     OOM killer picks a process inside the container, as wanted.
//   - runsc: the host cgroup holds the sentry and gofer (~50 threads, and on
//     ptrace ~5 host tasks per sandboxed process: 1130 for 200 forked Python
//     processes), and reaching any host limit kills the whole sandbox; so
//     the host limits are backstops with headroom, and the agent's guard
//     enforces the sandbox's memory and pids limits inside by killing the
//     offending process tree.
func (m *Manager) runtimeLimits(runtime string, l Limits) oci.Limits {
	if runtime == "runsc" {
		return oci.Limits{MemoryBytes: l.MemoryBytes + l.MemoryBytes/4 + 128*config.MiB, CPUs: l.CPUs, Pids: l.Pids*8 + 256}
	}
	return oci.Limits{MemoryBytes: l.MemoryBytes, CPUs: l.CPUs, Pids: l.Pids + 64}
}

func cgroupsPath(id ID) string { return "/kiln/" + id.String() }

// agentLogTail returns the end of the agent's log, for error messages.
func agentLogTail(dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, agentLog))
	if err != nil || len(b) == 0 {
		return ""
	}
	if len(b) > 512 {
		b = b[len(b)-512:]
	}
	return " (agent log: " + strings.TrimSpace(string(b)) + ")"
}

// watch marks a sandbox failed, and frees its resources, when its agent
// channel ends without a kill: the sandbox died (e.g. its sentry was
// OOM-killed on the host).
func (m *Manager) watch(b *box, conn *channel.Conn) {
	go m.liveness(b, conn)
	<-conn.Done()
	b.mu.Lock()
	if b.conn != conn || b.rec.State != StateRunning {
		b.mu.Unlock()
		return
	}
	b.mu.Unlock()
	reason := "sandbox exited unexpectedly"
	if err := conn.Err(); err != nil && !errors.Is(err, io.EOF) {
		reason += ": " + err.Error()
	}
	// The agent's last words go to the log; the reason keeps the one
	// line that says why it died, if it says.
	crash, tail := agentCrash(b.dir)
	if crash != "" {
		reason += " (agent: " + crash + ")"
	}
	m.log.Warn("sandbox exited unexpectedly", "sandbox_id", b.rec.ID, "err", conn.Err(), "agent_log", tail)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := m.destroy(ctx, b.rec.ID, StateFailed, reason); err != nil && !errors.Is(err, errdefs.ErrFailedPrecondition) {
		m.log.Error("cleaning up dead sandbox", "sandbox_id", b.rec.ID, "err", err)
	}
}

// Get returns a sandbox's record: a live one of this node, or a stored
// one (e.g. stopped or failed).
func (m *Manager) Get(ctx context.Context, id ID) (Sandbox, error) {
	if b, err := m.box(id); err == nil {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.rec, nil
	}
	return m.store.GetSandbox(ctx, id)
}

// Ending reports whether sandbox id is being destroyed (killed, expired,
// failed), without waiting for its lock, which the destroy holds while it
// tears the sandbox down: a data plane asked about a sandbox whose agent
// just went away (E2B's SDKs probe /health at once) answers "gone" at once.
func (m *Manager) Ending(id ID) bool {
	b, err := m.box(id)
	return err == nil && b.ending.Load()
}

// Drain makes Create refuse new sandboxes from now on, as unavailable
// with reason (a cluster node that is stopping: fronts place the create
// elsewhere). The sandboxes the Manager has keep running and serving;
// Active says how many are left.
func (m *Manager) Drain(reason string) { m.refusing.Store(&reason) }

// Active is how many of the Manager's sandboxes have not ended.
func (m *Manager) Active() int {
	n := 0
	for _, sb := range m.Live() {
		if !sb.State.Terminal() {
			n++
		}
	}
	return n
}

// Live returns the sandboxes this Manager runs, oldest first.
func (m *Manager) Live() []Sandbox {
	m.mu.Lock()
	boxes := slices.Collect(maps.Values(m.boxes))
	m.mu.Unlock()
	out := make([]Sandbox, 0, len(boxes))
	for _, b := range boxes {
		b.mu.Lock()
		out = append(out, b.rec)
		b.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b Sandbox) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return out
}

// List returns stored records matching f, a page at a time.
func (m *Manager) List(ctx context.Context, f Filter) ([]Sandbox, string, error) {
	return m.store.ListSandboxes(ctx, f)
}

func (m *Manager) box(id ID) (*box, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.boxes[id]
	if !ok {
		return nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	return b, nil
}

// Agent returns the client of a running sandbox's agent.
func (m *Manager) Agent(id ID) (*Agent, error) {
	b, err := m.box(id)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.rec.State != StateRunning || b.conn == nil {
		return nil, fmt.Errorf("sandbox %s is %s: %w", id, b.rec.State, errdefs.ErrFailedPrecondition)
	}
	return &Agent{conn: b.conn, layer: filepath.Join(b.dir, layerDir)}, nil
}

// Kill destroys a sandbox: its processes, container, layer and files.
func (m *Manager) Kill(ctx context.Context, id ID) error {
	return m.destroy(ctx, id, StateStopped, "killed")
}

// Fail destroys a sandbox as Kill does, but records it failed with
// reason: the end of a sandbox something outside declared gone (its node
// was marked lost while it still ran).
func (m *Manager) Fail(ctx context.Context, id ID, reason string) error {
	return m.destroy(ctx, id, StateFailed, reason)
}

// destroy moves a sandbox through stopping to final, removing everything
// it has on the host.
func (m *Manager) destroy(ctx context.Context, id ID, final State, reason string) error {
	b, err := m.claim(ctx, id)
	if err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return m.destroyLocked(ctx, b, final, reason)
}

// destroyLocked is destroy for a caller holding b.mu.
func (m *Manager) destroyLocked(ctx context.Context, b *box, final State, reason string) error {
	id := b.rec.ID
	b.ending.Store(true)
	// A sandbox whose earlier destroy failed may be destroyed again.
	if b.rec.State != StateFailed {
		if err := m.transition(ctx, b, StateStopping, reason); err != nil {
			return err
		}
	} else if final == StateStopped {
		final = StateFailed
	}
	if b.conn != nil {
		b.conn.Close()
		b.conn = nil
	}
	m.dropImage(b)
	rt := m.runtimes[b.rec.Runtime]
	var errs []error
	if rt != nil && !b.moved {
		errs = append(errs, deleteContainer(ctx, rt, id, b.dir, b.procs.get()))
	}
	if !b.moved { // nothing of a moved one is on this host
		errs = append(errs, rootfs.Unmount(ctx, filepath.Join(b.dir, layerDir)), m.detachNetwork(ctx, id))
	}
	if err := errors.Join(errs...); err != nil {
		_ = m.transition(ctx, b, StateFailed, "destroying: "+err.Error())
		return fmt.Errorf("destroying sandbox %s: %w", id, err)
	}
	if err := os.RemoveAll(b.dir); err != nil {
		return fmt.Errorf("removing sandbox dir: %w", err)
	}
	if b.rec.State != final {
		if err := m.transition(ctx, b, final, reason); err != nil {
			return err
		}
	}
	m.mu.Lock()
	delete(m.boxes, id)
	m.mu.Unlock()
	m.log.Info("sandbox destroyed", "sandbox_id", id, "state", final, "reason", reason)
	return nil
}

// Close stops the reaper, releases the Manager's channels and forgets its
// sandboxes; they keep running and a later Manager with Adopt re-adopts
// them.
func (m *Manager) Close() {
	m.closeOnce.Do(func() { close(m.done) })
	m.imageSeam().closePools() // pooled sandboxes have no record: destroy them
	m.mu.Lock()
	boxes := m.boxes
	m.boxes = make(map[ID]*box)
	m.mu.Unlock()
	for _, b := range boxes {
		b.mu.Lock()
		if b.conn != nil {
			b.conn.Close()
			b.conn = nil
		}
		b.mu.Unlock()
	}
}

// transition changes state and persists the record. Callers hold b.mu.
func (m *Manager) transition(ctx context.Context, b *box, to State, reason string) error {
	if err := checkTransition(b.rec.State, to); err != nil {
		return err
	}
	rec := b.rec
	rec.State = to
	if reason != "" {
		rec.Reason = m.shortReason(rec.ID, reason)
	}
	if to.Terminal() {
		rec = rec.Ended(to, rec.Reason, time.Now()) // the store keeps a tombstone
	}
	// Persist with a detached context: a client that went away must not
	// leave the record behind the sandbox's real state.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := m.store.PutSandbox(sctx, rec); err != nil {
		return fmt.Errorf("recording sandbox state %s: %w", to, err)
	}
	// Field by field: admit reads Owner and Limits of live boxes under
	// m.mu alone (the soak's race detector caught a whole-record write).
	b.rec.State, b.rec.Reason, b.rec.EndedAt = rec.State, rec.Reason, rec.EndedAt
	return nil
}

// validateVars checks env or metadata maps from callers.
func validateVars(what string, vars map[string]string, envName bool) error {
	if len(vars) > 256 {
		return fmt.Errorf("%s: more than 256 entries: %w", what, errdefs.ErrInvalidArgument)
	}
	for k, v := range vars {
		switch {
		case k == "" || len(k) > 256 || len(v) > 32<<10:
			return fmt.Errorf("%s %q: key must be 1-256 bytes and value at most 32 KiB: %w", what, errdefs.Clip(k), errdefs.ErrInvalidArgument)
		case strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0):
			return fmt.Errorf("%s %q: keys may not contain '=' or NUL, values not NUL: %w", what, errdefs.Clip(k), errdefs.ErrInvalidArgument)
		case envName && strings.HasPrefix(k, "KILN_"):
			return fmt.Errorf("env %q: the KILN_ prefix is reserved: %w", errdefs.Clip(k), errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// UpperDir is the overlay upper dir of live sandbox id: what it has
// written to its root filesystem (the template builder captures it).
func (m *Manager) UpperDir(id ID) (string, error) {
	m.mu.Lock()
	b, ok := m.boxes[id]
	m.mu.Unlock()
	if !ok {
		return "", fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	return rootfs.Upper(filepath.Join(b.dir, layerDir)), nil
}
