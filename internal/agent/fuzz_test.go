package agent

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
)

// fuzzMethods are the methods FuzzAgentMethods calls: every method of
// the wire contract, and names that are none.
var fuzzMethods = []string{
	wire.MethodPing, wire.MethodIdentify, wire.MethodExec, wire.MethodAttach, wire.MethodStdin,
	wire.MethodSignal, wire.MethodResize, wire.MethodProcesses, wire.MethodStat, wire.MethodList,
	wire.MethodMkdir, wire.MethodMove, wire.MethodRemove, wire.MethodRead, wire.MethodWrite,
	wire.MethodWatch, wire.MethodContextCreate, wire.MethodContexts, wire.MethodContextRestart,
	wire.MethodContextDelete, wire.MethodExecute, wire.MethodTunnel, "", "no_such_method",
}

// Hostile values the fuzzer's numbers pick from, besides its own strings.
var (
	fuzzUsers = []string{"", wire.UserDefault, wire.UserRoot, "nobody", "0", "65534", "1000:0", "root:root",
		"../root", "user\x00", "no-such-user", "-1", "4294967296"}
	// fuzzPaths are paths anywhere that reading may name: unreadable,
	// nonexistent, special, relative, NUL, long. Operations that change
	// something get paths in the scratch directory only (see fuzzInput.path).
	fuzzPaths = []string{"/root", "/root/.bashrc", "/etc/shadow", "/nonexistent/x", "/proc/self/mem",
		"/proc/1/environ", "/dev/null", "/dev/zero", "", ".", "..", "a\x00b", "~", "/tmp/../root",
		"/" + strings.Repeat("a", 5000), strings.Repeat("../", 100), "\xff\xfe", "/proc/self/fd/0"}
	fuzzLanguages = []string{"python", "bash", "javascript", "r", "java", "", "PY", "cobol", "python\x00", "js "}
	// fuzzCode is code the kernels run: fixed snippets (the fuzzer picks
	// one), never the fuzzer's own strings, which would run on the host.
	fuzzCode = []string{"1+1", "", "\x00", "import os; os._exit(3)", "exit 7", "process.exit(2)",
		"raise SystemExit", "x = '" + strings.Repeat("y", 70000) + "'", "print('\\xff')"}
	// fuzzCommands are the programs exec may start: harmless ones, or none.
	fuzzCommands = [][]string{{"true"}, {"/bin/false"}, {"/nonexistent"}, {"cat", "/etc/hostname"}, {""},
		{"sleep", "0.05"}, {"sh", "-c", "exit 3"}, {"sh", "-c", "kill -9 $$"}, {"sh", "-c", "echo $HOME; pwd"}, {}}
	fuzzSignals = []string{"SIGTERM", "SIGKILL", "", "SIGSTOP", "9", "SIGNOPE", "-1"}
)

// fuzzInput turns the fuzzer's values into hostile parameters.
type fuzzInput struct {
	scratch string // the only place changing operations may touch
	s1, s2  string
	n       int64
	pick    uint64
}

// choice picks from n options with the next bits of pick.
func (in *fuzzInput) choice(n int) int {
	i := int(in.pick % uint64(n))
	in.pick = in.pick/uint64(n) + in.pick%7
	return i
}

func (in *fuzzInput) user() string {
	if i := in.choice(len(fuzzUsers) + 1); i < len(fuzzUsers) {
		return fuzzUsers[i]
	}
	return in.s2
}

// path is a path for an operation: anywhere for one that only reads
// (readOnly), else in the scratch directory, whatever s says.
func (in *fuzzInput) path(s string, readOnly bool) string {
	if readOnly {
		if i := in.choice(len(fuzzPaths) + 1); i < len(fuzzPaths) {
			return fuzzPaths[i]
		}
	}
	clean := filepath.Clean("/" + strings.ReplaceAll(s, "\x00", ""))
	if strings.ContainsRune(s, 0) {
		clean += "\x00x"
	}
	return in.scratch + clean
}

func (in *fuzzInput) env() map[string]string {
	if in.choice(2) == 0 {
		return nil
	}
	return map[string]string{in.s1: in.s2, "KILN_SANDBOX_ID": in.s2, "PATH": in.s1, "": "x", "A=B": "c"}
}

// params builds hostile parameters for method.
func (in *fuzzInput) params(method string) any {
	switch method {
	case wire.MethodIdentify:
		p := wire.IdentifyParams{SandboxID: in.s1, Env: in.env(), Wait: in.choice(2) == 0}
		if in.choice(2) == 0 {
			p.Then = &wire.ExecuteParams{Language: fuzzLanguages[in.choice(len(fuzzLanguages))], Code: fuzzCode[in.choice(len(fuzzCode))], TimeoutMs: in.n}
		}
		return p
	case wire.MethodExec:
		p := wire.ExecParams{Args: fuzzCommands[in.choice(len(fuzzCommands))], Cwd: in.path(in.s1, true), Env: in.env(),
			User: in.user(), Tag: in.s2, TimeoutMs: in.n, OutputLimit: -in.n, Stdin: in.choice(2) == 0}
		if in.choice(3) == 0 {
			p.Args, p.Cmd = nil, "exit 3"
		}
		if in.choice(2) == 0 {
			p.PTY = &wire.PTYSize{Cols: uint16(in.n), Rows: uint16(in.n >> 16)}
		}
		return p
	case wire.MethodAttach:
		return wire.AttachParams{PID: int(in.n), AfterSeq: in.pick}
	case wire.MethodStdin:
		return wire.StdinParams{PID: int(in.n), Data: []byte(in.s1), Close: in.choice(2) == 0}
	case wire.MethodSignal:
		return wire.SignalParams{PID: int(in.n), Signal: fuzzSignals[in.choice(len(fuzzSignals))]}
	case wire.MethodResize:
		return wire.ResizeParams{PID: int(in.n), Size: wire.PTYSize{Cols: uint16(in.pick), Rows: uint16(in.n)}}
	case wire.MethodStat, wire.MethodRead:
		return wire.PathParams{Path: in.path(in.s1, true), User: in.user(), XattrPrefix: in.s2, ResolveLinks: in.choice(2) == 0}
	case wire.MethodList:
		p := wire.ListParams{Path: in.path(in.s1, in.choice(2) == 0), Depth: int(in.n), User: in.user(), XattrPrefix: in.s2}
		if !strings.HasPrefix(p.Path, in.scratch) {
			p.Depth %= 3 // a deep listing of / or /root would list the host
		}
		return p
	case wire.MethodMkdir, wire.MethodRemove:
		return wire.PathParams{Path: in.path(in.s1, false), User: in.user()}
	case wire.MethodMove:
		return wire.MoveParams{From: in.path(in.s1, false), To: in.path(in.s2, false), User: in.user()}
	case wire.MethodWrite:
		return wire.WriteParams{Path: in.path(in.s1, false), User: in.user(), Mode: uint32(in.n), Append: in.choice(2) == 0,
			InPlace: in.choice(2) == 0, XattrPrefix: in.s2, Xattrs: map[string]string{in.s1: in.s2}}
	case wire.MethodWatch:
		return wire.WatchParams{Path: in.path(in.s1, false), Recursive: in.choice(2) == 0, User: in.user()}
	case wire.MethodContextCreate:
		return wire.ContextParams{Language: fuzzLanguages[in.choice(len(fuzzLanguages))], Cwd: in.path(in.s1, true), Env: in.env(), User: in.user()}
	case wire.MethodContexts:
		return wire.ContextsParams{Defaults: []string{in.s1, fuzzLanguages[in.choice(len(fuzzLanguages))]}}
	case wire.MethodContextRestart, wire.MethodContextDelete:
		return wire.ContextIDParams{ID: in.s1}
	case wire.MethodExecute:
		return wire.ExecuteParams{ContextID: in.s2, Language: fuzzLanguages[in.choice(len(fuzzLanguages))],
			Code: fuzzCode[in.choice(len(fuzzCode))], Env: in.env(), TimeoutMs: in.n, Hidden: in.choice(2) == 0}
	case wire.MethodTunnel:
		return wire.TunnelParams{Port: int(in.n)}
	}
	return in.s1
}

// FuzzAgentMethods drives every agent method of a real agent (in-process,
// over the real channel) with hostile arguments: unreadable, nonexistent
// and special paths, other users, huge and negative numbers, NULs, wrong
// JSON types and unknown methods. Every call must be answered, with a
// result or an error of the API's classes, within its deadline; no method
// may panic (the agent recovers, but a panic is a bug); and the agent must
// still answer a ping afterwards. The changing operations (write, mkdir,
// move, remove, watch) only get paths in a scratch directory, and the
// processes and kernels started run fixed harmless programs: the agent
// runs on the host here.
func FuzzAgentMethods(f *testing.F) {
	for i := range fuzzMethods {
		f.Add(uint8(i), "/root", "", int64(-1), uint64(i*7))
		f.Add(uint8(i), "a\x00b", "user", int64(1)<<62, uint64(i*13+1))
		f.Add(uint8(i), "../../etc", "root", int64(0), uint64(i*31+2))
	}
	f.Add(uint8(16), "/root", "", int64(0), uint64(0))               // context_create in /root: used to kill the agent
	f.Add(uint8(2), "x", "y", int64(0), uint64(1))                   // exec with wrong-typed params (below)
	f.Add(uint8(20), "nope", "", int64(-5), uint64(3))               // execute with a negative timeout
	f.Add(uint8(9), "", "user.x", int64(1<<40), uint64(5))           // list depth 2^40
	f.Add(uint8(21), "", "", int64(22), uint64(0))                   // tunnel to a port that may not listen
	f.Add(uint8(14), "dir/f", "user.\x00", int64(0o7777), uint64(9)) // write with setuid bits
	keepInheritedFDs()
	h := newHarness(f, func(c *Config) { c.BaseEnv = append(c.BaseEnv, "PATH=/usr/bin:/bin") })
	scratch := f.TempDir()
	for _, d := range []string{"open", "open/sub"} {
		if err := os.MkdirAll(filepath.Join(scratch, d), 0o777); err != nil {
			f.Fatal(err)
		}
		os.Chmod(filepath.Join(scratch, d), 0o777)
	}
	os.Mkdir(filepath.Join(scratch, "closed"), 0o700)
	os.WriteFile(filepath.Join(scratch, "closed", "secret"), []byte("s"), 0o600)
	os.Symlink("/nonexistent", filepath.Join(scratch, "dangling"))
	os.Symlink("loop", filepath.Join(scratch, "loop"))
	syscall.Mkfifo(filepath.Join(scratch, "fifo"), 0o666)
	f.Fuzz(func(t *testing.T, m uint8, s1, s2 string, n int64, pick uint64) {
		method := fuzzMethods[int(m)%len(fuzzMethods)]
		in := &fuzzInput{scratch: scratch, s1: s1, s2: s2, n: n, pick: pick}
		var params any = in.params(method)
		if pick%11 == 1 { // the wrong JSON types for every field
			params = map[string]any{"path": 1, "args": "x", "pid": "1", "user": []int{1}, "language": false,
				"cwd": map[string]int{}, "timeout_ms": "soon", "defaults": "python", "port": -1.5, "size": 7}
		}
		if err := fuzzCall(h, method, params); err != nil {
			t.Fatalf("%s %+q: %v", method, params, err)
		}
		if n := h.panics.Load(); n > 0 {
			t.Fatalf("%s %+q: a method panicked (%d so far; the log has the stack)", method, params, n)
		}
		var pong wire.Pong
		if err := callOn(h.conn, wire.MethodPing, nil, &pong); err != nil || pong.Agent == "" {
			t.Fatalf("after %s %+q the agent does not answer a ping: %v", method, params, err)
		}
		fuzzCleanup(t, h)
	})
}

// fuzzCall makes one call and reads what it streams until it ends; a
// call that streams without end (watch, a tunnel, a process) is ended by
// closing its stream once it has shown it works. It returns an error only
// if the agent failed to answer: no answer in time, or an error outside
// the API's classes.
func fuzzCall(h *harness, method string, params any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := h.conn.Call(ctx, method, params)
	if err != nil {
		return err
	}
	defer st.Close()
	if method == wire.MethodWrite {
		if err := st.SendData(ctx, []byte("hostile\x00data")); err == nil {
			_ = st.CloseSend()
		}
	}
	if method == wire.MethodTunnel {
		_ = st.CloseSend()
	}
	// Streams that may not end by themselves get a few seconds.
	rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
	defer rcancel()
	for {
		_, err := st.Recv(rctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if rctx.Err() != nil && ctx.Err() == nil {
				return nil // still streaming: alive, and closed by the deferred Close
			}
			return answered(err)
		}
	}
	var res json.RawMessage
	return answered(st.Wait(ctx, &res))
}

// answered is nil if err is a call's answer: none, or an error of the
// API's classes (a recovered panic is one too: the harness counts those).
func answered(err error) error {
	var ae *api.Error
	if err == nil || errors.As(err, &ae) && ae.Code != "" {
		return nil
	}
	return err
}

// fuzzCleanup ends what an input left behind: running processes and
// contexts (kernels), so that inputs do not add up.
func fuzzCleanup(t *testing.T, h *harness) {
	var procs []api.ProcessInfo
	if err := callOn(h.conn, wire.MethodProcesses, nil, &procs); err != nil {
		t.Fatalf("listing processes: %v", err)
	}
	for _, p := range procs {
		if p.Exit == nil {
			_ = callOn(h.conn, wire.MethodSignal, wire.SignalParams{PID: p.PID, Signal: "SIGKILL"}, nil)
		}
	}
	var cs []api.Context
	if err := callOn(h.conn, wire.MethodContexts, nil, &cs); err != nil {
		t.Fatalf("listing contexts: %v", err)
	}
	for _, c := range cs {
		_ = callOn(h.conn, wire.MethodContextDelete, wire.ContextIDParams{ID: c.ID}, nil)
	}
}

// keepInheritedFDs marks every descriptor this process inherited beyond
// stdio close-on-exec, so the processes and kernels the agent starts
// here do not inherit them. A fuzz worker gets its pipes to the
// coordinator that way (and make and the shell theirs): a kernel that
// outlives a worker which died or was killed would hold them open, and
// the coordinator would wait for their end forever instead of reporting
// the worker's end. (In a sandbox the agent is PID 1 and has none.)
func keepInheritedFDs() {
	des, _ := os.ReadDir("/proc/self/fd")
	for _, d := range des {
		if fd, err := strconv.Atoi(d.Name()); err == nil && fd > 2 {
			syscall.CloseOnExec(fd)
		}
	}
}
