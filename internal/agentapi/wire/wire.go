// Package wire names the agent's methods and their parameters and results:
// the contract between the host and kiln-agent, carried by package channel.
// Imports only the standard library and api.
package wire

// Method names. Streams carry api.Event values as event frames, and file
// contents as data frames.
const (
	// MethodPing returns Pong; the command round-trip floor.
	MethodPing = "ping"
	// MethodIdentify tells the agent which sandbox it serves now
	// (IdentifyParams). A sandbox restored from a checkpoint (a fork, a
	// snapshot, a warm template or pool) starts with the memory of the
	// agent that was checkpointed, whose identity and environment were
	// another sandbox's; the host sends this on the first session of every
	// such sandbox, before anything else. Processes and contexts started
	// afterwards see the new environment; running ones keep theirs.
	MethodIdentify = "identify"

	// MethodExec starts a process (ExecParams) and streams its events:
	// start, stdout/stderr (with seq), exit. Closing the stream detaches;
	// the process keeps running until it exits or its timeout passes.
	// Result: api.ExitStatus if it ran to completion while attached.
	MethodExec = "exec"
	// MethodAttach re-attaches to a process (AttachParams): buffered events
	// after AfterSeq are replayed, then live ones follow, as for exec.
	MethodAttach = "attach"
	// MethodStdin writes to a process's stdin or closes it (StdinParams).
	// On a PTY, closing sends the terminal's EOF character (^D).
	MethodStdin = "stdin"
	// MethodSignal sends a signal to a process's group (SignalParams).
	MethodSignal = "signal"
	// MethodResize changes a PTY's size (ResizeParams).
	MethodResize = "resize"
	// MethodProcesses lists processes started through the agent, running
	// and recently ended. Result: []api.ProcessInfo.
	MethodProcesses = "processes"

	// MethodStat returns api.FileInfo for PathParams.
	MethodStat = "stat"
	// MethodList lists for ListParams: the entries travel in order as
	// events, each a []api.FileInfo of at most ListBatch entries, and the
	// result is empty. (Agents before batching answered the whole
	// []api.FileInfo as the result, which had to fit one frame.)
	MethodList = "list"
	// MethodMkdir creates a directory and its parents (PathParams), owned
	// by the user. Result: api.FileInfo.
	MethodMkdir = "mkdir"
	// MethodMove renames (MoveParams). Result: api.FileInfo of the target.
	MethodMove = "move"
	// MethodRemove removes a file or a directory tree (PathParams).
	MethodRemove = "remove"
	// MethodRead streams a file's contents as data frames (PathParams).
	// Result: api.FileInfo.
	MethodRead = "read"
	// MethodWrite receives data frames until the host's end frame and
	// writes them to a file, creating parents (WriteParams). Result:
	// api.FileInfo.
	MethodWrite = "write"
	// MethodWatch streams file events for a directory (WatchParams) until
	// the stream is closed or the directory itself is removed or moved.
	// The first event has type start (Seq 1): the watch is established,
	// and changes made after it are reported. An error event
	// (resource_exhausted) says the kernel dropped events; watching goes
	// on.
	MethodWatch = "watch"
)

// IdentifyParams is a sandbox's identity: its id (KILN_SANDBOX_ID in
// what processes see) and its environment, which replaces the one the
// agent started with (Env holds no KILN_* variables).
type IdentifyParams struct {
	SandboxID string            `json:"sandbox_id"`
	Env       map[string]string `json:"env,omitempty"`
	// Then is code for the default context of its language (its
	// ContextID and Env are ignored) that runs after the call, before
	// any execution sent after it, without the call waiting for it: the
	// host gives a kernel running since the checkpoint the new identity
	// this way. Its output is discarded; the agent logs its failure.
	Then *ExecuteParams `json:"then,omitempty"`
	// Wait makes the call return once Then has run; its failure is then
	// the call's.
	Wait bool `json:"wait,omitempty"`
}

// ListBatch is the most entries one MethodList event carries.
const ListBatch = 512

// Users a caller may name; anything else is rejected.
const (
	UserDefault = "user" // uid 1000, home /home/user
	UserRoot    = "root"
)

// Pong answers MethodPing.
type Pong struct {
	Agent string `json:"agent"`
}

// ExecParams starts a process. Exactly one of Args or Cmd is set: Cmd is a
// shell string run as `bash -lc Cmd`.
type ExecParams struct {
	Args []string          `json:"args,omitempty"`
	Cmd  string            `json:"cmd,omitempty"`
	Cwd  string            `json:"cwd,omitempty"` // default: the user's home
	Env  map[string]string `json:"env,omitempty"`
	User string            `json:"user,omitempty"` // "user" (default) or "root"
	Tag  string            `json:"tag,omitempty"`  // caller's label for finding it later
	// TimeoutMs kills the process and its children after this long; 0
	// means no timeout (only for background processes the host tracks).
	TimeoutMs int64 `json:"timeout_ms,omitempty"`
	// OutputLimit caps stdout+stderr bytes delivered; the rest is dropped
	// and the exit status says Truncated. 0 means the agent's default.
	OutputLimit int64 `json:"output_limit,omitempty"`
	// Stdin keeps stdin open for MethodStdin; otherwise it is /dev/null.
	Stdin bool     `json:"stdin,omitempty"`
	PTY   *PTYSize `json:"pty,omitempty"` // run on a terminal of this size
}

// PTYSize is a terminal size.
type PTYSize struct {
	Cols uint16 `json:"cols"`
	Rows uint16 `json:"rows"`
}

// AttachParams re-attaches to a running or recently ended process.
type AttachParams struct {
	PID      int    `json:"pid"`
	AfterSeq uint64 `json:"after_seq,omitempty"`
}

// StdinParams writes Data to a process's stdin, then closes it if Close.
type StdinParams struct {
	PID   int    `json:"pid"`
	Data  []byte `json:"data,omitempty"`
	Close bool   `json:"close,omitempty"`
}

// SignalParams sends Signal (e.g. "SIGTERM", "SIGKILL", "SIGINT") to a
// process and its process group.
type SignalParams struct {
	PID    int    `json:"pid"`
	Signal string `json:"signal"`
}

// ResizeParams resizes a process's PTY.
type ResizeParams struct {
	PID  int     `json:"pid"`
	Size PTYSize `json:"size"`
}

// PathParams names one path. Relative paths are relative to the user's
// home; User decides ownership of what is created and whose permissions
// apply ("user" by default).
type PathParams struct {
	Path string `json:"path"`
	User string `json:"user,omitempty"`
	// XattrPrefix, if set (it must start with "user."), adds the
	// extended attributes whose names start with it to the result
	// (api.FileInfo.Xattrs).
	XattrPrefix string `json:"xattr_prefix,omitempty"`
	// ResolveLinks adds to a symlink what it finally points to
	// (api.FileInfo.Target), unless it is broken.
	ResolveLinks bool `json:"resolve_links,omitempty"`
}

// ListParams lists a directory to Depth levels (1 = its entries only).
type ListParams struct {
	Path  string `json:"path"`
	Depth int    `json:"depth,omitempty"`
	User  string `json:"user,omitempty"`
	// XattrPrefix and ResolveLinks add to each entry, as for PathParams.
	XattrPrefix  string `json:"xattr_prefix,omitempty"`
	ResolveLinks bool   `json:"resolve_links,omitempty"`
}

// MoveParams renames From to To, creating To's parents.
type MoveParams struct {
	From string `json:"from"`
	To   string `json:"to"`
	User string `json:"user,omitempty"`
}

// WriteParams writes a file from the data frames that follow.
type WriteParams struct {
	Path string `json:"path"`
	User string `json:"user,omitempty"`
	Mode uint32 `json:"mode,omitempty"` // permission bits; default 0644
	// Append appends instead of replacing.
	Append bool `json:"append,omitempty"`
	// InPlace truncates and rewrites the file itself rather than writing
	// a temporary file and renaming it over, so watchers see the file's
	// own create and write events (a reader may see it half-written).
	InPlace bool `json:"in_place,omitempty"`
	// XattrPrefix, if set (it must start with "user."), replaces the
	// file's extended attributes under it with Xattrs, whose names are
	// relative to the prefix.
	XattrPrefix string            `json:"xattr_prefix,omitempty"`
	Xattrs      map[string]string `json:"xattrs,omitempty"`
}

// WatchParams watches a directory, and its subdirectories if Recursive.
type WatchParams struct {
	Path      string `json:"path"`
	Recursive bool   `json:"recursive,omitempty"`
	User      string `json:"user,omitempty"`
}

// Code execution methods (kernels).
const (
	// MethodContextCreate starts a context (ContextParams). Result:
	// api.Context.
	MethodContextCreate = "context_create"
	// MethodContexts lists contexts (ContextsParams, which may be
	// absent). Result: []api.Context.
	MethodContexts = "contexts"
	// MethodContextRestart restarts a context's interpreter, losing its
	// state (ContextIDParams). Result: api.Context.
	MethodContextRestart = "context_restart"
	// MethodContextDelete stops and forgets a context (ContextIDParams).
	MethodContextDelete = "context_delete"
	// MethodExecute runs code in a context (ExecuteParams) and streams
	// api.Events: stdout, stderr, result, execution_error, then done with
	// the execution count. Executions in one context run in order; in
	// different contexts, in parallel. A timeout interrupts the code and
	// the context survives.
	MethodExecute = "execute"
)

// MethodTunnel connects to a TCP port on the sandbox's loopback
// (TunnelParams) and pipes bytes both ways: data frames from the host go
// to the port until the host's end frame, the port's bytes come back as
// data frames; one event (TunnelOpen) says the connection is made. The
// call ends when the port's side closes. Exposed ports use it for servers
// bound to 127.0.0.1 and for sandboxes without a network.
const MethodTunnel = "tunnel"

// TunnelParams names the port to connect to on 127.0.0.1.
type TunnelParams struct {
	Port int `json:"port"`
}

// TunnelOpen is the event that says a tunnel's connection is made.
type TunnelOpen struct {
	Open bool `json:"open"`
}

// ContextParams creates a context.
type ContextParams struct {
	Language string            `json:"language"`
	Cwd      string            `json:"cwd,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	User     string            `json:"user,omitempty"`
}

// ContextIDParams names a context.
type ContextIDParams struct {
	ID string `json:"id"`
}

// ExecuteParams runs code. Without ContextID the language's default
// context is used (and created on first use).
type ExecuteParams struct {
	ContextID string            `json:"context_id,omitempty"`
	Language  string            `json:"language,omitempty"`
	Code      string            `json:"code"`
	Env       map[string]string `json:"env,omitempty"`
	TimeoutMs int64             `json:"timeout_ms,omitempty"`
	// Hidden runs code the host runs for itself (a warm template's
	// imports): it is not counted in the context's execution count nor
	// kept in its history, so the user's first execution is number 1.
	Hidden bool `json:"hidden,omitempty"`
}

// ContextsParams lists contexts (MethodContexts). Defaults names
// languages whose default context the list includes, registered first if
// it is not yet (its interpreter starts with its first execution): E2B's
// code interpreter lists the Python and JavaScript contexts from the
// start.
type ContextsParams struct {
	Defaults []string `json:"defaults,omitempty"`
}

// Hosts is the /etc/hosts Kiln gives a sandbox whose template has none:
// localhost, and the sandbox's hostname (so getaddrinfo of either works,
// as Java's InetAddress.getLocalHost needs). The host writes it into a
// fresh layer before the sandbox first starts; a restored agent whose
// hostname changed rewrites a file that is exactly Hosts of another name
// (and nothing else) on identify.
func Hosts(hostname string) string {
	return "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t" + hostname + "\n"
}
