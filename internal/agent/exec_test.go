package agent

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
)

func TestPing(t *testing.T) {
	h := newHarness(t)
	var pong wire.Pong
	if err := h.conn.Invoke(context.Background(), wire.MethodPing, nil, &pong); err != nil {
		t.Fatal(err)
	}
	if pong.Agent != Version {
		t.Errorf("pong.Agent = %q, want %q", pong.Agent, Version)
	}
}

func TestExec(t *testing.T) {
	h := newHarness(t)
	dir := userDir(t)
	tests := []struct {
		name   string
		p      wire.ExecParams
		stdout string
		stderr string
		code   int
		err    api.ErrorCode
		root   bool
	}{
		{name: "argv", p: wire.ExecParams{Args: []string{"echo", "hello", "world"}}, stdout: "hello world\n"},
		{name: "argv is not a shell", p: wire.ExecParams{Args: []string{"echo", "$HOME;", "*"}}, stdout: "$HOME; *\n"},
		{name: "shell string", p: wire.ExecParams{Cmd: "echo out; echo err >&2; exit 3"}, stdout: "out\n", stderr: "err\n", code: 3},
		{name: "true", p: wire.ExecParams{Args: []string{"true"}}},
		{name: "exit code", p: wire.ExecParams{Args: []string{"sh", "-c", "exit 42"}}, code: 42},
		{name: "env", p: wire.ExecParams{Cmd: "echo $FOO:$LANG", Env: map[string]string{"FOO": "bar"}}, stdout: "bar:C.UTF-8\n"},
		{name: "no KILN_ variables", p: wire.ExecParams{Cmd: "env | grep -c ^KILN_ || true"}, stdout: "0\n"},
		{name: "cwd", p: wire.ExecParams{Args: []string{"pwd"}, Cwd: dir}, stdout: dir + "\n"},
		{name: "root", p: wire.ExecParams{Cmd: "id -u; echo $HOME $USER", User: "root"}, stdout: "0\n/root root\n", root: true},
		{name: "default user", p: wire.ExecParams{Cmd: "id -u; id -g; echo $USER"}, stdout: "1000\n1000\nuser\n", root: true},
		{name: "missing executable", p: wire.ExecParams{Args: []string{"no-such-program-kiln"}}, err: api.CodeNotFound},
		{name: "missing cwd", p: wire.ExecParams{Args: []string{"true"}, Cwd: "/no/such/dir"}, err: api.CodeNotFound},
		{name: "unknown user", p: wire.ExecParams{Args: []string{"true"}, User: "mallory"}, err: api.CodeInvalidArgument},
		{name: "args and cmd", p: wire.ExecParams{Args: []string{"true"}, Cmd: "true"}, err: api.CodeInvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.root {
				requireRoot(t)
			}
			r := h.exec(tc.p)
			if tc.err != "" {
				if errCode(r.err) != tc.err {
					t.Fatalf("error = %v, want code %s", r.err, tc.err)
				}
				return
			}
			if r.err != nil {
				t.Fatalf("exec: %v", r.err)
			}
			if got := r.output(api.EventStdout); got != tc.stdout {
				t.Errorf("stdout = %q, want %q", got, tc.stdout)
			}
			if got := r.output(api.EventStderr); got != tc.stderr {
				t.Errorf("stderr = %q, want %q", got, tc.stderr)
			}
			if r.status.Code != tc.code || r.status.Reason != "" {
				t.Errorf("status = %+v, want code %d", r.status, tc.code)
			}
		})
	}
}

// Events are numbered from 1 without gaps, start first, exit last, and
// output arrives while the process runs.
func TestExecStreaming(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := h.conn.Call(ctx, wire.MethodExec, wire.ExecParams{Cmd: "echo first; sleep 0.5; echo second; echo third >&2"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	start := nextEvent(t, ctx, st)
	if start.Type != api.EventStart || start.Seq != 1 || start.PID <= 0 {
		t.Fatalf("first event = %+v, want start with seq 1 and a pid", start)
	}
	t0 := time.Now()
	first := nextEvent(t, ctx, st)
	if first.Type != api.EventStdout || string(first.Data) != "first\n" {
		t.Fatalf("second event = %+v, want stdout first", first)
	}
	if d := time.Since(t0); d > 400*time.Millisecond {
		t.Errorf("first output took %v: not streamed live", d)
	}
	r := collect(ctx, st)
	if r.err != nil {
		t.Fatal(r.err)
	}
	events := append([]api.Event{start, first}, r.events...)
	for i, ev := range events {
		if ev.Seq != uint64(i+1) {
			t.Fatalf("event %d has seq %d", i, ev.Seq)
		}
	}
	last := events[len(events)-1]
	if last.Type != api.EventExit || last.Exit == nil || last.Exit.Code != 0 || last.PID != start.PID {
		t.Fatalf("last event = %+v, want exit 0 of pid %d", last, start.PID)
	}
	if got := r.output(api.EventStdout) + r.output(api.EventStderr); got != "second\nthird\n" {
		t.Errorf("later output = %q", got)
	}
}

func TestStdin(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := h.conn.Call(ctx, wire.MethodExec, wire.ExecParams{Args: []string{"cat"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	pid := nextEvent(t, ctx, st).PID
	if err := h.conn.Invoke(ctx, wire.MethodStdin, wire.StdinParams{PID: pid, Data: []byte("hello ")}, nil); err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, ctx, st); string(ev.Data) != "hello " {
		t.Fatalf("echoed %+v", ev)
	}
	if err := h.conn.Invoke(ctx, wire.MethodStdin, wire.StdinParams{PID: pid, Data: []byte("world"), Close: true}, nil); err != nil {
		t.Fatal(err)
	}
	r := collect(ctx, st)
	if r.err != nil || r.output(api.EventStdout) != "world" || r.status.Code != 0 {
		t.Fatalf("result = %+v", r)
	}
	err = h.conn.Invoke(ctx, wire.MethodStdin, wire.StdinParams{PID: pid, Data: []byte("late")}, nil)
	if errCode(err) != api.CodeFailedPrecondition {
		t.Errorf("stdin after exit: %v, want failed_precondition", err)
	}
}

func TestSignal(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := h.conn.Call(ctx, wire.MethodExec, wire.ExecParams{Args: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	pid := nextEvent(t, ctx, st).PID
	err = h.conn.Invoke(ctx, wire.MethodSignal, wire.SignalParams{PID: pid, Signal: "BOGUS"}, nil)
	if errCode(err) != api.CodeInvalidArgument {
		t.Errorf("bogus signal: %v", err)
	}
	if err := h.conn.Invoke(ctx, wire.MethodSignal, wire.SignalParams{PID: pid, Signal: "SIGTERM"}, nil); err != nil {
		t.Fatal(err)
	}
	r := collect(ctx, st)
	want := api.ExitStatus{Code: 143, Signal: "SIGTERM", Reason: api.ExitSignaled}
	if r.err != nil || r.status != want {
		t.Fatalf("status = %+v, %v; want %+v", r.status, r.err, want)
	}
}

// A timeout kills the whole tree: background children, and children that
// left the process group with setsid.
func TestTimeoutKillsTree(t *testing.T) {
	h := newHarness(t)
	r := h.exec(wire.ExecParams{
		Cmd:       "sleep 100 & echo $!; setsid sleep 100 & echo $!; sleep 100",
		TimeoutMs: 500,
	})
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.status.Reason != api.ExitTimeout || r.status.Signal != "SIGKILL" || r.status.Message == "" {
		t.Errorf("status = %+v, want a timeout", r.status)
	}
	pids := strings.Fields(r.output(api.EventStdout))
	if len(pids) != 2 {
		t.Fatalf("children = %q", pids)
	}
	for _, pid := range pids {
		waitGone(t, pid)
	}
}

// waitGone waits until a process no longer runs (it may linger as a
// zombie of whoever adopted it).
func waitGone(t *testing.T, pid string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		b, err := os.ReadFile(filepath.Join("/proc", pid, "stat"))
		if err != nil {
			return
		}
		if f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:])); len(f) > 0 && f[0] == "Z" {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Errorf("process %s survived", pid)
}

// Output beyond the cap is drained and dropped: the process runs to the
// end without blocking, and the agent stays usable.
func TestOutputLimit(t *testing.T) {
	h := newHarness(t)
	const limit = 4 << 20
	start := time.Now()
	r := h.exec(wire.ExecParams{Cmd: "head -c 200M /dev/zero; echo done >&2", OutputLimit: limit})
	if r.err != nil {
		t.Fatal(r.err)
	}
	got := len(r.output(api.EventStdout)) + len(r.output(api.EventStderr))
	if got > limit {
		t.Errorf("delivered %d bytes, more than the cap %d", got, limit)
	}
	if !r.status.Truncated || r.status.Reason != api.ExitOutputLimit || r.status.Code != 0 {
		t.Errorf("status = %+v, want truncated", r.status)
	}
	for _, ev := range r.events {
		if len(ev.Data) > 32<<10 {
			t.Fatalf("event of %d bytes", len(ev.Data))
		}
	}
	t.Logf("200 MiB flood took %v, delivered %d bytes", time.Since(start), got)
	if r := h.exec(wire.ExecParams{Args: []string{"echo", "ok"}}); r.output(api.EventStdout) != "ok\n" {
		t.Errorf("agent unusable after flood: %+v", r)
	}
}

// Closing an exec stream detaches; attach replays what was missed and
// follows to the end.
func TestDetachAttach(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := h.conn.Call(ctx, wire.MethodExec, wire.ExecParams{Cmd: "for i in $(seq 1 10); do echo line$i; sleep 0.05; done"})
	if err != nil {
		t.Fatal(err)
	}
	pid := nextEvent(t, ctx, st).PID
	seen := nextEvent(t, ctx, st)
	st.Close() // detach
	time.Sleep(200 * time.Millisecond)

	at, err := h.conn.Call(ctx, wire.MethodAttach, wire.AttachParams{PID: pid, AfterSeq: seen.Seq})
	if err != nil {
		t.Fatal(err)
	}
	defer at.Close()
	r := collect(ctx, at)
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.events[0].Seq != seen.Seq+1 {
		t.Errorf("replay starts at seq %d, want %d", r.events[0].Seq, seen.Seq+1)
	}
	var want strings.Builder
	for i := 1; i <= 10; i++ {
		want.WriteString("line" + strconv.Itoa(i) + "\n")
	}
	if got := string(seen.Data) + r.output(api.EventStdout); got != want.String() {
		t.Errorf("output = %q", got)
	}
	if r.status.Code != 0 {
		t.Errorf("status = %+v", r.status)
	}

	// After the end, attaching from 0 replays everything.
	again, err := h.conn.Call(ctx, wire.MethodAttach, wire.AttachParams{PID: pid})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	all := collect(ctx, again)
	if all.err != nil || all.events[0].Type != api.EventStart || all.output(api.EventStdout) != want.String() {
		t.Errorf("full replay = %+v", all)
	}
	if err := h.conn.Invoke(ctx, wire.MethodAttach, wire.AttachParams{PID: 1 << 30}, nil); errCode(err) != api.CodeNotFound {
		t.Errorf("attach to unknown pid: %v", err)
	}
}

func TestPTY(t *testing.T) {
	h := newHarness(t)
	r := h.exec(wire.ExecParams{Args: []string{"tty"}, PTY: &wire.PTYSize{Cols: 80, Rows: 24}})
	if r.err != nil || !strings.HasPrefix(r.output(api.EventStdout), "/dev/pts/") {
		t.Fatalf("tty printed %q (%v)", r.output(api.EventStdout), r.err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := h.conn.Call(ctx, wire.MethodExec, wire.ExecParams{
		Cmd: "stty size; echo $TERM; read x; stty size", PTY: &wire.PTYSize{Cols: 80, Rows: 24}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	pid := nextEvent(t, ctx, st).PID
	var out string
	for !strings.Contains(out, "xterm") {
		out += string(nextEvent(t, ctx, st).Data)
	}
	if !strings.Contains(out, "24 80") {
		t.Errorf("initial size: %q", out)
	}
	if err := h.conn.Invoke(ctx, wire.MethodResize, wire.ResizeParams{PID: pid, Size: wire.PTYSize{Cols: 100, Rows: 30}}, nil); err != nil {
		t.Fatal(err)
	}
	if err := h.conn.Invoke(ctx, wire.MethodStdin, wire.StdinParams{PID: pid, Data: []byte("\n")}, nil); err != nil {
		t.Fatal(err)
	}
	rest := collect(ctx, st)
	if rest.err != nil || !strings.Contains(rest.output(api.EventStdout), "30 100") {
		t.Errorf("after resize: %q (%v)", rest.output(api.EventStdout), rest.err)
	}
	if rest.output(api.EventStderr) != "" {
		t.Errorf("a terminal has one output stream, got stderr %q", rest.output(api.EventStderr))
	}
}

func TestProcesses(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := h.conn.Call(ctx, wire.MethodExec, wire.ExecParams{Args: []string{"sleep", "100"}, Tag: "bg"})
	if err != nil {
		t.Fatal(err)
	}
	pid := nextEvent(t, ctx, st).PID
	st.Close()

	find := func() *api.ProcessInfo {
		var list []api.ProcessInfo
		if err := h.conn.Invoke(ctx, wire.MethodProcesses, nil, &list); err != nil {
			t.Fatal(err)
		}
		for _, p := range list {
			if p.PID == pid {
				return &p
			}
		}
		return nil
	}
	p := find()
	if p == nil || p.Tag != "bg" || p.Exit != nil || p.Args[0] != "sleep" {
		t.Fatalf("running process = %+v", p)
	}
	if err := h.conn.Invoke(ctx, wire.MethodSignal, wire.SignalParams{PID: pid, Signal: "kill"}, nil); err != nil {
		t.Fatal(err)
	}
	for p = find(); p != nil && p.Exit == nil; p = find() {
		time.Sleep(10 * time.Millisecond)
	}
	if p == nil || p.Exit.Signal != "SIGKILL" {
		t.Fatalf("ended process = %+v", p)
	}
}

// A new host session replaces the old one on the same pipes; processes
// survive and can be re-attached.
func TestSessionReplacement(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := h.conn.Call(ctx, wire.MethodExec, wire.ExecParams{Cmd: "for i in $(seq 1 20); do echo line$i; sleep 0.05; done"})
	if err != nil {
		t.Fatal(err)
	}
	pid := nextEvent(t, ctx, st).PID
	seen := nextEvent(t, ctx, st)
	h.drop()

	h.conn = h.connect()
	at, err := h.conn.Call(ctx, wire.MethodAttach, wire.AttachParams{PID: pid, AfterSeq: seen.Seq})
	if err != nil {
		t.Fatal(err)
	}
	defer at.Close()
	r := collect(ctx, at)
	if r.err != nil {
		t.Fatal(r.err)
	}
	out := string(seen.Data) + r.output(api.EventStdout)
	if !strings.HasPrefix(out, "line1\nline2\n") || !strings.HasSuffix(out, "line20\n") || strings.Count(out, "\n") != 20 {
		t.Errorf("output across sessions = %q", out)
	}
	if r.status.Code != 0 {
		t.Errorf("status = %+v", r.status)
	}
}
