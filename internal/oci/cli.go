package oci

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

var (
	_ Runtime = (*CLI)(nil)
	_ Pauser  = (*CLI)(nil)
)

// Config configures a runtime binary.
type Config struct {
	Binary string   // path or name in $PATH; default the runtime's name
	Root   string   // state dir; default /run/kiln/<name>
	Flags  []string // extra global flags, e.g. runsc --platform=systrap
}

// CLI drives an OCI runtime binary with the runc command-line interface.
// It keeps no state of its own: everything lives in the runtime's root dir,
// so a restarted host process can pick up where the last one stopped.
type CLI struct {
	name   string
	binary string
	root   string
	flags  []string // global flags, before the subcommand

	// netFlags remembers runsc's --network per container from Create to
	// Start: runsc sets the network up at start, with start's flags.
	netFlags sync.Map // id → []string
}

// Runsc returns gVisor's runsc. Sandboxes get no network but loopback
// (--network=none, which overrides any --network in c.Flags) unless their
// spec names a network namespace to join: then gVisor's netstack runs
// over that namespace's interfaces (--network=sandbox). c.Flags should
// carry RunscFlags' choices (platform, overlay).
func Runsc(c Config) *CLI {
	return newCLI("runsc", c, append([]string(nil), c.Flags...))
}

// Runc returns runc (namespaces, cgroups and seccomp on the host kernel).
func Runc(c Config) *CLI {
	return newCLI("runc", c, append([]string(nil), c.Flags...))
}

func newCLI(name string, c Config, flags []string) *CLI {
	cl := &CLI{name: name, binary: c.Binary, root: c.Root}
	if cl.binary == "" {
		cl.binary = name
	}
	if cl.root == "" {
		cl.root = filepath.Join("/run/kiln", name)
	}
	cl.flags = append([]string{"--root=" + cl.root}, flags...)
	return cl
}

// Name is "runsc" or "runc".
func (c *CLI) Name() string { return c.name }

// Root is the runtime's state dir.
func (c *CLI) Root() string { return c.root }

// Create creates container id from b, which must already be written. The
// create command's stderr, and the container's when io.Stderr is nil, go
// to b.Dir/create.log, as does the runtime's own log. A failed create is
// deleted again.
func (c *CLI) Create(ctx context.Context, id string, b *Bundle, io IO) (err error) {
	if err := checkID(id); err != nil {
		return err
	}
	if err := os.MkdirAll(c.root, 0o700); err != nil {
		return fmt.Errorf("creating state dir: %w", err)
	}
	logPath := filepath.Join(b.Dir, CreateLog)
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("opening create log: %w", err)
	}
	defer logf.Close()
	start, _ := logf.Seek(0, 2)

	args := append(c.args(c.networkFlag(b)...), "--log="+logPath, "create", "--bundle="+b.Dir, id)
	cmd := exec.CommandContext(ctx, c.binary, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = io.Stdin, io.Stdout, io.Stderr
	if io.Stdin == nil {
		cmd.Stdin = nil // exec.Cmd treats a typed nil as a file
	}
	if io.Stdout == nil {
		cmd.Stdout = nil
	}
	if io.Stderr == nil {
		cmd.Stderr = logf
	}
	// All three are *os.File (or nil), so Wait copies nothing and returns
	// when create exits, though the container keeps the files open.
	if err := cmd.Run(); err != nil {
		msg := readFrom(logPath, start)
		// Unwind: runsc leaves cgroups behind but no state to find them by.
		cleanup := context.WithoutCancel(ctx)
		_ = c.Delete(cleanup, id, true)
		if b.Spec != nil && b.Spec.Linux != nil && b.Spec.Linux.CgroupsPath != "" {
			_ = removeCgroups(cleanup, b.Spec.Linux.CgroupsPath)
		}
		return fmt.Errorf("%s create %s: %w: %s", c.name, id, err, msg)
	}
	c.netFlags.Store(id, c.networkFlag(b))
	return nil
}

// Start runs the created container's process.
func (c *CLI) Start(ctx context.Context, id string) error {
	args := []string{"start", id}
	if f, ok := c.netFlags.LoadAndDelete(id); ok {
		args = append(f.([]string), args...)
	} else if st, err := c.State(ctx, id); err == nil {
		if b, err := ReadBundle(st.Bundle); err == nil {
			args = append(c.networkFlag(b), args...)
		}
	}
	_, err := c.run(ctx, id, args...)
	return err
}

// State reports the container's state; an unknown id is errdefs.ErrNotFound.
func (c *CLI) State(ctx context.Context, id string) (State, error) {
	out, err := c.run(ctx, id, "state", id)
	if err != nil {
		return State{}, err
	}
	var st struct {
		ID     string `json:"id"`
		Status string `json:"status"`
		Pid    int    `json:"pid"`
		Bundle string `json:"bundle"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return State{}, fmt.Errorf("decoding %s state: %w", c.name, err)
	}
	return State{ID: st.ID, Status: st.Status, Pid: st.Pid, Bundle: st.Bundle, HelperPids: c.helperPids(id)}, nil
}

// helperPids finds the runtime's helper processes for a container that
// `state` does not report: runsc's gofer, from runsc's state file.
func (c *CLI) helperPids(id string) []int {
	if st, ok := c.stateFile(id); ok && st.GoferPid > 0 {
		return []int{st.GoferPid}
	}
	return nil
}

// runscState is what Kiln reads of runsc's state file.
type runscState struct {
	BundleDir string `json:"bundleDir"`
	GoferPid  int    `json:"goferPid"`
	Sandbox   struct {
		Pid int `json:"pid"`
	} `json:"sandbox"`
}

// stateFile reads runsc's own record of container id (its root's
// "<id>_sandbox:<sandbox id>.state"); false for runc, or when there is
// none or it does not parse.
func (c *CLI) stateFile(id string) (runscState, bool) {
	if c.name != "runsc" || checkID(id) != nil {
		return runscState{}, false
	}
	files, _ := filepath.Glob(filepath.Join(c.root, id+"_sandbox:*.state"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var st runscState
		if json.Unmarshal(b, &st) == nil {
			return st, true
		}
	}
	return runscState{}, false
}

// Pids returns the host processes of container id: its sandbox (runsc's
// Sentry; runc's init) first, then any helpers (runsc's gofer). For runsc
// they come from its state file, which costs no runsc command (`runsc
// state` is a ~12 ms CPU process start, on every create); for runc, and
// when runsc's file cannot be read, from State.
func (c *CLI) Pids(ctx context.Context, id string) ([]int, error) {
	if st, ok := c.stateFile(id); ok && st.Sandbox.Pid > 0 {
		pids := []int{st.Sandbox.Pid}
		if st.GoferPid > 0 {
			pids = append(pids, st.GoferPid)
		}
		return pids, nil
	}
	st, err := c.State(ctx, id)
	if err != nil {
		return nil, err
	}
	return append([]int{st.Pid}, st.HelperPids...), nil
}

// Kill sends sig to the container's init process.
func (c *CLI) Kill(ctx context.Context, id string, sig syscall.Signal) error {
	_, err := c.run(ctx, id, "kill", id, strconv.Itoa(int(sig)))
	return err
}

// Pause freezes every process of the container.
func (c *CLI) Pause(ctx context.Context, id string) error {
	_, err := c.run(ctx, id, "pause", id)
	return err
}

// Resume thaws a paused container.
func (c *CLI) Resume(ctx context.Context, id string) error {
	_, err := c.run(ctx, id, "resume", id)
	return err
}

// Delete removes the container; force kills it first if it runs. Deleting
// an unknown id succeeds. Cgroups the runtime leaves behind are removed.
func (c *CLI) Delete(ctx context.Context, id string, force bool) error {
	if err := checkID(id); err != nil {
		return err
	}
	var cgroupsPath string
	bundle := ""
	if st, ok := c.stateFile(id); ok && st.BundleDir != "" {
		bundle = st.BundleDir // no `runsc state` process
	} else if st, err := c.State(ctx, id); err == nil {
		bundle = st.Bundle
	}
	if bundle != "" {
		if b, err := ReadBundle(bundle); err == nil && b.Spec.Linux != nil {
			cgroupsPath = b.Spec.Linux.CgroupsPath
		}
	}
	args := []string{"delete"}
	if force {
		args = append(args, "--force")
	}
	if _, err := c.run(ctx, id, append(args, id)...); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return err
	}
	if cgroupsPath != "" {
		if err := removeCgroups(ctx, cgroupsPath); err != nil {
			return fmt.Errorf("deleting %s: %w", id, err)
		}
	}
	return nil
}

// networkFlag is runsc's --network for a bundle (see Runsc).
func (c *CLI) networkFlag(b *Bundle) []string {
	if c.name != "runsc" {
		return nil
	}
	if b.Spec != nil && b.Spec.Linux != nil {
		for _, ns := range b.Spec.Linux.Namespaces {
			if ns.Type == specs.NetworkNamespace && ns.Path != "" {
				return []string{"--network=sandbox"}
			}
		}
	}
	return []string{"--network=none"}
}

func (c *CLI) args(extra ...string) []string {
	return append(append([]string(nil), c.flags...), extra...)
}

// run runs a short subcommand and returns its stdout. Errors carry stderr;
// a missing container maps to errdefs.ErrNotFound.
func (c *CLI) run(ctx context.Context, id string, args ...string) ([]byte, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, c.binary, c.args(args...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = time.Second // never hang on a pipe a stray child holds
	err := cmd.Run()
	if errors.Is(err, exec.ErrWaitDelay) {
		// The command succeeded; only a child it left (runsc start's
		// sandbox, under load) still held its pipes when WaitDelay ran out.
		err = nil
	}
	if err != nil {
		msg := shorten(strings.TrimSpace(stderr.String()))
		if isNotExist(msg) {
			err = errors.Join(err, errdefs.ErrNotFound)
		}
		return nil, fmt.Errorf("%s %s: %w: %s", c.name, strings.Join(args, " "), err, msg)
	}
	return stdout.Bytes(), nil
}

func isNotExist(stderr string) bool {
	s := strings.ToLower(stderr)
	return strings.Contains(s, "does not exist") || strings.Contains(s, "no such file or directory") ||
		strings.Contains(s, "not found")
}

// shorten cuts the middle out of a long message: runsc can dump whole
// serialized objects into one (e.g. a checkpoint that hit a full disk).
func shorten(s string) string {
	if len(s) <= 1024 {
		return s
	}
	return s[:512] + " … " + s[len(s)-256:]
}

// checkID accepts ids safe as path elements and command arguments.
func checkID(id string) error {
	if id == "" || len(id) > 128 || id[0] == '-' || id[0] == '.' {
		return fmt.Errorf("checking container id %q: %w", id, errdefs.ErrInvalidArgument)
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return fmt.Errorf("checking container id %q: %w", id, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// readFrom returns the tail of the file after offset, for error messages.
func readFrom(path string, off int64) string {
	b, err := os.ReadFile(path)
	if err != nil || off > int64(len(b)) {
		return ""
	}
	b = b[off:]
	if len(b) > 4096 {
		b = b[len(b)-4096:]
	}
	return strings.TrimSpace(string(b))
}
