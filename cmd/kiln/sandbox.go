package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/client"
)

// The sandbox, files and keys commands are thin clients of a running
// server (kiln serve); they share the remote type below.

// remoteHelp ends the usage text of every client command.
const remoteHelp = `
The server is KILN_URL (default http://127.0.0.1:8420), the API key
KILN_API_KEY. Flags may come before or after the arguments; --json prints
JSON for scripts.

Exit codes:
  0  ok
  1  error talking to the server, or a server-side error
  2  usage error
  3  not found
  4  unauthenticated or permission denied
  sandbox exec and sandbox logs exit with the command's own exit code;
  sandbox code exits 1 when the code raised an exception.
`

const sandboxUsage = `Usage:
  kiln sandbox create [flags]                   create a sandbox, print its id
  kiln sandbox ls [--state S] [--metadata K=V]  list sandboxes
  kiln sandbox get ID                           show one sandbox
  kiln sandbox kill ID...                       destroy sandboxes
  kiln sandbox exec ID [flags] -- CMD [ARG...]  run a command, stream its output
  kiln sandbox logs ID PID [--after-seq N]      re-attach to a command's output
  kiln sandbox code ID [--lang L] [FILE|-]      run code in the sandbox's interpreter
  kiln sandbox ps ID                            list a sandbox's commands
  kiln sandbox timeout ID DURATION              set how long it lives from now
  kiln sandbox pause ID                         pause it (to disk on runsc, frozen on runc)
  kiln sandbox resume ID                        resume a paused sandbox
  kiln sandbox fork ID [--count N]              fork it into N sandboxes
  kiln sandbox snapshot ID NAME                 take a named snapshot (kiln snapshot ls|rm)
  kiln sandbox network ID [flags]               show or change its network and egress policy
  kiln sandbox screenshot ID [-o FILE]          save a PNG of its screen (desktop sandboxes)

Run 'kiln sandbox COMMAND -h' for a command's flags and examples.
` + remoteHelp

// remote runs the client commands: an API client and where to print.
type remote struct {
	c      *client.Client
	stdout io.Writer
	stderr io.Writer
	stdin  io.Reader
}

func newRemote() *remote {
	return &remote{c: client.FromEnv(), stdout: os.Stdout, stderr: os.Stderr, stdin: os.Stdin}
}

func sandboxCmd(ctx context.Context, args []string) error { return newRemote().sandbox(ctx, args) }

func (r *remote) sandbox(ctx context.Context, args []string) error {
	cmds := map[string]func(context.Context, []string) error{
		"create": r.sandboxCreate, "ls": r.sandboxList, "list": r.sandboxList, "get": r.sandboxGet,
		"kill": r.sandboxKill, "rm": r.sandboxKill, "exec": r.sandboxExec, "logs": r.sandboxLogs,
		"ps": r.sandboxPs, "timeout": r.sandboxTimeout, "code": r.sandboxCode,
		"pause": r.sandboxPause, "resume": r.sandboxResume, "fork": r.sandboxFork,
		"snapshot": r.sandboxSnapshot,
		"network":  r.sandboxNetwork, "screenshot": r.sandboxScreenshot,
	}
	return r.dispatch(ctx, "sandbox", sandboxUsage, cmds, args)
}

// dispatch runs the subcommand args[0] and maps its error to an exit code.
func (r *remote) dispatch(ctx context.Context, name, usage string, cmds map[string]func(context.Context, []string) error, args []string) error {
	if len(args) == 0 {
		fmt.Fprint(r.stderr, usage)
		return exitError{2}
	}
	switch args[0] {
	case "-h", "--help", "help":
		fmt.Fprint(r.stdout, usage)
		return nil
	}
	cmd, ok := cmds[args[0]]
	if !ok {
		fmt.Fprintf(r.stderr, "kiln %s: unknown command %q\n\n%s", name, args[0], usage)
		return exitError{2}
	}
	return r.exit(cmd(ctx, args[1:]))
}

// exit maps API errors to the documented exit codes, printing them.
// Other errors go to main, which prints them and exits 1.
func (r *remote) exit(err error) error {
	if err == nil || errors.As(err, new(exitError)) {
		return err
	}
	code := errorExitCode(err)
	if code == 1 {
		return err
	}
	fmt.Fprintln(r.stderr, "kiln:", err)
	return exitError{code}
}

// errorExitCode is the exit code for an error: 3 not found, 4
// unauthenticated or permission denied, else 1.
func errorExitCode(err error) int {
	switch {
	case client.IsCode(err, api.CodeNotFound):
		return 3
	case client.IsCode(err, api.CodeUnauthenticated), client.IsCode(err, api.CodePermissionDenied):
		return 4
	}
	return 1
}

// command is one subcommand's flags and usage.
type command struct {
	r    *remote
	fs   *flag.FlagSet
	json *bool
}

func (r *remote) command(name, usage string) *command {
	fs := flag.NewFlagSet("kiln "+name, flag.ContinueOnError)
	fs.SetOutput(r.stderr)
	c := &command{r: r, fs: fs, json: fs.Bool("json", false, "print JSON for scripts")}
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage, "\nFlags:\n")
		fs.PrintDefaults()
		fmt.Fprint(fs.Output(), remoteHelp)
	}
	return c
}

// parse parses flags wherever they are among the arguments and returns the
// positional ones, checking there are between min and max (-1: any).
// Arguments after "--" are not parsed as flags.
func (c *command) parse(args []string, min, max int) ([]string, error) {
	pos, err := c.scan(args, -1)
	if err != nil {
		return nil, err
	}
	if len(pos) < min || (max >= 0 && len(pos) > max) {
		return nil, c.usageError("wrong number of arguments")
	}
	return pos, nil
}

// scan parses flags among the arguments until "--" or until it has seen
// stop positional arguments (-1: no limit); what follows is returned as
// it is, after the positional arguments seen.
func (c *command) scan(args []string, stop int) ([]string, error) {
	var pos []string
	for {
		if err := c.fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, exitError{0}
			}
			return nil, exitError{2}
		}
		rest := c.fs.Args()
		dashed := len(rest) < len(args) && args[len(args)-len(rest)-1] == "--"
		if len(rest) == 0 || dashed || len(pos) == stop {
			return append(pos, rest...), nil
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
}

func (c *command) usageError(msg string) error {
	fmt.Fprintf(c.fs.Output(), "%s: %s\n\n", c.fs.Name(), msg)
	c.fs.Usage()
	return exitError{2}
}

// printJSON prints v as indented JSON.
func (r *remote) printJSON(v any) error {
	enc := json.NewEncoder(r.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func (r *remote) table() *tabwriter.Writer { return tabwriter.NewWriter(r.stdout, 0, 4, 2, ' ', 0) }

// stringsFlag collects repeated (or comma-separated) values.
type stringsFlag []string

func (s *stringsFlag) String() string { return strings.Join(*s, ",") }
func (s *stringsFlag) Set(v string) error {
	*s = append(*s, strings.Split(v, ",")...)
	return nil
}

// seconds converts a duration to whole seconds, rounding up.
func seconds(d time.Duration) int64 { return int64(math.Ceil(d.Seconds())) }

// parseDuration accepts 10m, 1h30m or a plain number of seconds.
func parseDuration(s string) (time.Duration, error) {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return time.Duration(n) * time.Second, nil
	}
	return time.ParseDuration(s)
}

// age prints a duration the way ls tables do: 45s, 12m, 5h, 3d.
func age(d time.Duration) string {
	switch d = d.Round(time.Second); {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

// expires prints when a sandbox expires, relative to now.
func expires(sb api.Sandbox, now time.Time) string {
	switch {
	case sb.ExpiresAt.IsZero() || sb.State == "stopped" || sb.State == "failed":
		return "-"
	case sb.ExpiresAt.Before(now):
		return "now"
	}
	return "in " + age(sb.ExpiresAt.Sub(now))
}

// bytesString prints a byte count with a binary unit: 512M, 1.5G.
func bytesString(n int64) string {
	const unit = 1 << 10
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	v, i := float64(n), -1
	for v >= unit && i < 3 {
		v /= unit
		i++
	}
	return strconv.FormatFloat(math.Round(v*10)/10, 'f', -1, 64) + string("KMGT"[i])
}

// pairs prints a map as sorted K=V pairs.
func pairs(m map[string]string) string {
	var s []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		s = append(s, k+"="+m[k])
	}
	return strings.Join(s, ",")
}

const createUsage = `Usage: kiln sandbox create [flags]

Creates a sandbox and prints its id (with --json, the sandbox).

Examples:
  kiln sandbox create
  kiln sandbox create --template python --timeout 30m --memory 1G --metadata job=ci
  ID=$(kiln sandbox create --env DEBUG=1)
  kiln sandbox create --snapshot before-training --env RUN=2
  kiln sandbox create --timeout 10m --auto-pause
  kiln sandbox create --network nat --egress deny --allow pypi.org --allow 10.1.0.0/16
`

func (r *remote) sandboxCreate(ctx context.Context, args []string) error {
	c := r.command("sandbox create", createUsage)
	var req api.CreateSandboxRequest
	env, meta := envFlag{}, envFlag{}
	c.fs.StringVar(&req.Template, "template", "", "template to create it from (default: the server's, base)")
	c.fs.StringVar(&req.Runtime, "runtime", "", "isolation runtime: runsc (gVisor) or runc (default: the server's)")
	timeout := c.fs.Duration("timeout", 0, "lifetime before it is killed, e.g. 30m (default: the server's, 5m)")
	c.fs.Float64Var(&req.Limits.CPUs, "cpus", 0, "CPU cores (default: the template's or server's)")
	c.fs.Var(sizeFlag{&req.Limits.MemoryBytes}, "memory", "memory limit, e.g. 512M")
	c.fs.Var(sizeFlag{&req.Limits.DiskBytes}, "disk", "writable disk size, e.g. 1G")
	c.fs.Int64Var(&req.Limits.Pids, "pids", 0, "maximum number of processes")
	c.fs.Var(env, "env", "environment variable `KEY=VALUE` for every command (repeatable)")
	c.fs.Var(meta, "metadata", "metadata `KEY=VALUE` to find it by (repeatable)")
	c.fs.StringVar(&req.Snapshot, "snapshot", "", "start from this snapshot of yours (its template, runtime and limits)")
	c.fs.BoolVar(&req.AutoPause, "auto-pause", false, "pause instead of kill at the timeout; the next use resumes it")
	c.fs.Var((*volumeMounts)(&req.Volumes), "volume", "mount your volume `NAME:/PATH` (add :ro for read-only; repeatable)")
	nf := addNetworkFlags(c.fs, true)
	if _, err := c.parse(args, 0, 0); err != nil {
		return err
	}
	req.Network = nf.request()
	req.Timeout = seconds(*timeout)
	if len(env) > 0 {
		req.Env = env
	}
	if len(meta) > 0 {
		req.Metadata = meta
	}
	sb, err := r.c.CreateSandbox(ctx, req)
	if err != nil {
		return err
	}
	if *c.json {
		return r.printJSON(sb)
	}
	fmt.Fprintln(r.stdout, sb.ID)
	return nil
}

const listUsage = `Usage: kiln sandbox ls [--state S]... [--metadata K=V]...

Lists your sandboxes: ID TEMPLATE RUNTIME STATE AGE EXPIRES.

Examples:
  kiln sandbox ls
  kiln sandbox ls --state running --metadata job=ci
  kiln sandbox ls --json | jq -r '.[].id'
`

func (r *remote) sandboxList(ctx context.Context, args []string) error {
	c := r.command("sandbox ls", listUsage)
	var f client.ListFilter
	meta := envFlag{}
	c.fs.Var((*stringsFlag)(&f.States), "state", "only sandboxes in this `state`: creating, running, paused, stopping, stopped, failed (repeatable)")
	c.fs.Var(meta, "metadata", "only sandboxes with metadata `KEY=VALUE` (repeatable)")
	if _, err := c.parse(args, 0, 0); err != nil {
		return err
	}
	f.Metadata = meta
	sbs := []api.Sandbox{}
	for sb, err := range r.c.AllSandboxes(ctx, f) {
		if err != nil {
			return err
		}
		sbs = append(sbs, sb)
	}
	if *c.json {
		return r.printJSON(sbs)
	}
	now := time.Now()
	tw := r.table()
	fmt.Fprintln(tw, "ID\tTEMPLATE\tRUNTIME\tSTATE\tAGE\tEXPIRES")
	for _, sb := range sbs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", sb.ID, sb.Template, sb.Runtime, sb.State, age(now.Sub(sb.CreatedAt)), expires(sb, now))
	}
	return tw.Flush()
}

const getUsage = `Usage: kiln sandbox get ID

Shows a sandbox, including a stopped or failed one and why it ended.

Examples:
  kiln sandbox get i8cx2kq0v7n3ma5wd1ef
  kiln sandbox get i8cx2kq0v7n3ma5wd1ef --json
`

func (r *remote) sandboxGet(ctx context.Context, args []string) error {
	c := r.command("sandbox get", getUsage)
	pos, err := c.parse(args, 1, 1)
	if err != nil {
		return err
	}
	sb, err := r.c.GetSandbox(ctx, pos[0])
	if err != nil {
		return err
	}
	if *c.json {
		return r.printJSON(sb)
	}
	now := time.Now()
	tw := r.table()
	row := func(k, v string) {
		if v != "" {
			fmt.Fprintf(tw, "%s:\t%s\n", k, v)
		}
	}
	row("ID", sb.ID)
	row("Template", sb.Template)
	row("Runtime", sb.Runtime)
	row("State", sb.State)
	row("Reason", sb.Reason)
	row("Created", sb.CreatedAt.Local().Format(time.RFC3339)+" ("+age(now.Sub(sb.CreatedAt))+" ago)")
	if e := expires(*sb, now); e != "-" {
		row("Expires", sb.ExpiresAt.Local().Format(time.RFC3339)+" ("+e+")")
	}
	if l := sb.Limits; l != (api.Limits{}) {
		row("CPUs", strconv.FormatFloat(l.CPUs, 'f', -1, 64))
		row("Memory", bytesString(l.MemoryBytes))
		row("Disk", bytesString(l.DiskBytes))
		row("Pids", strconv.FormatInt(l.Pids, 10))
	}
	row("Env", pairs(sb.Env))
	row("Metadata", pairs(sb.Metadata))
	return tw.Flush()
}

const killUsage = `Usage: kiln sandbox kill ID...

Destroys sandboxes and everything in them, printing each id killed. It
tries every id; the exit code is that of the first failure.

Examples:
  kiln sandbox kill i8cx2kq0v7n3ma5wd1ef sbx_def456
  kiln sandbox ls --state running --json | jq -r '.[].id' | xargs kiln sandbox kill
`

func (r *remote) sandboxKill(ctx context.Context, args []string) error {
	c := r.command("sandbox kill", killUsage)
	ids, err := c.parse(args, 1, -1)
	if err != nil {
		return err
	}
	killed := []string{}
	var first error
	for _, id := range ids {
		if err := r.c.KillSandbox(ctx, id); err != nil {
			if first == nil {
				first = err
			}
			if len(ids) > 1 {
				fmt.Fprintf(r.stderr, "kiln: %s: %v\n", id, err)
			}
			continue
		}
		killed = append(killed, id)
		if !*c.json {
			fmt.Fprintln(r.stdout, id)
		}
	}
	if *c.json {
		if err := r.printJSON(map[string][]string{"killed": killed}); err != nil {
			return err
		}
	}
	if first != nil && len(ids) > 1 {
		return exitError{errorExitCode(first)} // each error is printed already
	}
	return first
}

const execUsage = `Usage: kiln sandbox exec ID [flags] -- COMMAND [ARG...]

Runs a command in a sandbox, streams its output to stdout and stderr, and
exits with its exit code. If the connection drops, the command keeps
running; the message says how to re-attach with 'kiln sandbox logs'. With
--json it prints the command's collected result ({pid, stdout, stderr,
exit}) when it ends instead of streaming.

Examples:
  kiln sandbox exec i8cx2kq0v7n3ma5wd1ef -- python3 -c 'print(6*7)'
  kiln sandbox exec i8cx2kq0v7n3ma5wd1ef --user root --cwd /etc -- ls -la
  kiln sandbox exec i8cx2kq0v7n3ma5wd1ef --shell -- 'pip install requests && python3 app.py'
`

func (r *remote) sandboxExec(ctx context.Context, args []string) error {
	c := r.command("sandbox exec", execUsage)
	var req api.CommandRequest
	env := envFlag{}
	c.fs.StringVar(&req.User, "user", "", "run as `user` (default) or root")
	c.fs.StringVar(&req.Cwd, "cwd", "", "working `directory` (default: the user's home)")
	c.fs.Var(env, "env", "environment variable `KEY=VALUE` (repeatable)")
	c.fs.StringVar(&req.Tag, "tag", "", "a `tag` to find the command by in 'kiln sandbox ps'")
	timeout := c.fs.Duration("timeout", 60*time.Second, "kill the command (and its children) after this long")
	shell := c.fs.Bool("shell", false, "run COMMAND [ARG...], joined with spaces, with bash -lc")
	pos, err := c.scan(args, 1)
	if err != nil {
		return err
	}
	if len(pos) < 2 {
		return c.usageError("want a sandbox ID and a command")
	}
	id, argv := pos[0], pos[1:]
	if *shell {
		req.Cmd = strings.Join(argv, " ")
	} else {
		req.Args = argv
	}
	req.Timeout = timeout.Seconds()
	if len(env) > 0 {
		req.Env = env
	}
	if *c.json {
		res, err := r.c.Output(ctx, id, req)
		if err != nil {
			return err
		}
		if err := r.printJSON(res); err != nil {
			return err
		}
		return exitCode(res.Exit)
	}
	res, err := r.c.Run(ctx, id, req, client.RunOptions{
		OnStdout: func(b []byte) { r.stdout.Write(b) },
		OnStderr: func(b []byte) { r.stderr.Write(b) },
	})
	return r.finish(ctx, id, res, err)
}

// finish reports how a streamed command ended and returns its exit code.
func (r *remote) finish(ctx context.Context, id string, res client.Result, err error) error {
	var dropped *client.DroppedError
	if errors.As(err, &dropped) {
		if ctx.Err() != nil {
			fmt.Fprintf(r.stderr, "\nkiln: detached; command %d is still running\n", dropped.PID)
		} else {
			fmt.Fprintf(r.stderr, "kiln: %v\n", err)
		}
		if dropped.PID != 0 {
			fmt.Fprintf(r.stderr, "kiln: re-attach with: kiln sandbox logs %s %d --after-seq %d\n", id, dropped.PID, dropped.LastSeq)
		}
		if ctx.Err() != nil {
			return exitError{130}
		}
		return exitError{1}
	}
	if err != nil {
		return err
	}
	switch {
	case res.Exit.Message != "":
		fmt.Fprintln(r.stderr, "kiln:", res.Exit.Message)
	case res.Exit.Reason != api.ExitNormal:
		fmt.Fprintln(r.stderr, "kiln: command ended:", res.Exit.Reason)
	}
	return exitCode(res.Exit)
}

// exitCode returns the command's exit code as this process's.
func exitCode(e api.ExitStatus) error {
	if e.Code != 0 {
		return exitError{e.Code}
	}
	return nil
}

const logsUsage = `Usage: kiln sandbox logs ID PID [--after-seq N]

Re-attaches to a command: replays its buffered output after event N, then
follows it live until it exits, and exits with its exit code. With --json
it prints the events as NDJSON instead.

Examples:
  kiln sandbox logs i8cx2kq0v7n3ma5wd1ef 42
  kiln sandbox logs i8cx2kq0v7n3ma5wd1ef 42 --after-seq 17
  kiln sandbox logs i8cx2kq0v7n3ma5wd1ef 42 --json | jq -c 'select(.type=="exit")'
`

func (r *remote) sandboxLogs(ctx context.Context, args []string) error {
	c := r.command("sandbox logs", logsUsage)
	after := c.fs.Uint64("after-seq", 0, "only events after this `seq` (from a dropped exec's message)")
	pos, err := c.parse(args, 2, 2)
	if err != nil {
		return err
	}
	pid, err := strconv.Atoi(pos[1])
	if err != nil || pid <= 0 {
		return c.usageError(fmt.Sprintf("PID %q: want a positive number", pos[1]))
	}
	var opts client.RunOptions
	if *c.json {
		enc := json.NewEncoder(r.stdout)
		opts.OnEvent = func(ev api.Event) { enc.Encode(ev) }
	} else {
		opts.OnStdout = func(b []byte) { r.stdout.Write(b) }
		opts.OnStderr = func(b []byte) { r.stderr.Write(b) }
	}
	res, err := r.c.Attach(ctx, pos[0], pid, *after, opts)
	return r.finish(ctx, pos[0], res, err)
}

const psUsage = `Usage: kiln sandbox ps ID

Lists the commands started in a sandbox: PID TAG STATUS STARTED COMMAND.

Examples:
  kiln sandbox ps i8cx2kq0v7n3ma5wd1ef
`

func (r *remote) sandboxPs(ctx context.Context, args []string) error {
	c := r.command("sandbox ps", psUsage)
	pos, err := c.parse(args, 1, 1)
	if err != nil {
		return err
	}
	ps, err := r.c.Processes(ctx, pos[0])
	if err != nil {
		return err
	}
	if *c.json {
		if ps == nil {
			ps = []api.ProcessInfo{}
		}
		return r.printJSON(ps)
	}
	now := time.Now()
	tw := r.table()
	fmt.Fprintln(tw, "PID\tTAG\tSTATUS\tSTARTED\tCOMMAND")
	for _, p := range ps {
		status := "running"
		if p.Exit != nil {
			status = fmt.Sprintf("exited (%d)", p.Exit.Code)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s ago\t%s\n", p.PID, p.Tag, status, age(now.Sub(p.StartedAt)), strings.Join(p.Args, " "))
	}
	return tw.Flush()
}

const timeoutUsage = `Usage: kiln sandbox timeout ID DURATION

Sets how long the sandbox lives from now before it is killed, and prints
when that is. DURATION is like 10m or 1h30m, or a number of seconds.

Examples:
  kiln sandbox timeout i8cx2kq0v7n3ma5wd1ef 10m
  kiln sandbox timeout i8cx2kq0v7n3ma5wd1ef 3600
`

func (r *remote) sandboxTimeout(ctx context.Context, args []string) error {
	c := r.command("sandbox timeout", timeoutUsage)
	pos, err := c.parse(args, 2, 2)
	if err != nil {
		return err
	}
	d, err := parseDuration(pos[1])
	if err != nil || d <= 0 {
		return c.usageError(fmt.Sprintf("DURATION %q: want e.g. 10m or a number of seconds", pos[1]))
	}
	sb, err := r.c.SetTimeout(ctx, pos[0], d)
	if err != nil {
		return err
	}
	if *c.json {
		return r.printJSON(sb)
	}
	fmt.Fprintf(r.stdout, "%s expires at %s (%s)\n", sb.ID, sb.ExpiresAt.Local().Format(time.RFC3339), expires(*sb, time.Now()))
	return nil
}
