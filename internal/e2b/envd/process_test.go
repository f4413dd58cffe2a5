package envd_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/kiln-sh/kiln/internal/e2b/envd/spec/process"
)

// run is what a process stream delivered.
type run struct {
	pid            uint32
	stdout, stderr string
	pty            string
	end            *process.ProcessEvent_EndEvent
	keepalives     int
	firstNotStart  bool
}

// collect reads a Start or Connect stream to its end.
func collect[T any, PT interface {
	*T
	GetEvent() *process.ProcessEvent
}](s *connect.ServerStreamForClient[T], onData func(run)) (run, error) {
	var r run
	n := 0
	for s.Receive() {
		ev := PT(s.Msg()).GetEvent()
		if n == 0 && ev.GetStart() == nil {
			r.firstNotStart = true
		}
		n++
		switch e := ev.GetEvent().(type) {
		case *process.ProcessEvent_Start:
			r.pid = e.Start.GetPid()
		case *process.ProcessEvent_Data:
			r.stdout += string(e.Data.GetStdout())
			r.stderr += string(e.Data.GetStderr())
			r.pty += string(e.Data.GetPty())
		case *process.ProcessEvent_End:
			r.end = e.End
		case *process.ProcessEvent_Keepalive:
			r.keepalives++
		}
		if onData != nil {
			onData(r)
		}
	}
	return r, s.Err()
}

// bash is the SDK's commands.run request shape.
func bash(cmd string) *process.ProcessConfig {
	return &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", cmd}}
}

func ptr[T any](v T) *T { return &v }

func TestProcessStart(t *testing.T) {
	e := newEnv(t, sandboxOpts())
	type want struct {
		stdout, stderr string
		code           int32
		status         string
		errText        string // the end event's error; "" = absent
	}
	tests := []struct {
		name string
		user string
		req  *process.StartRequest
		want want
	}{
		{"output and exit code", "", &process.StartRequest{Process: bash("echo hello; echo oops >&2; exit 3"), Stdin: ptr(false)},
			want{"hello\n", "oops\n", 3, "exit status 3", "exit status 3"}},
		{"success has no error", "", &process.StartRequest{Process: bash("printf ok")},
			want{"ok", "", 0, "exit status 0", ""}},
		{"envs, cwd and default user", "", &process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/bash",
			Args: []string{"-l", "-c", `echo "$FOO $(pwd) $(whoami) $HOME $SANDBOX_GLOBAL"`}, Envs: map[string]string{"FOO": "bar"}, Cwd: ptr("/tmp")}},
			want{"bar /tmp user /home/user from-create\n", "", 0, "exit status 0", ""}},
		{"root by basic auth", "root", &process.StartRequest{Process: bash("whoami; pwd")},
			want{"root\n/home/user\n", "", 0, "exit status 0", ""}},
		{"relative and ~ cwd", "", &process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/pwd", Cwd: ptr("~/")}},
			want{"/home/user\n", "", 0, "exit status 0", ""}},
		{"killed by a signal", "", &process.StartRequest{Process: bash("kill -9 $$")},
			want{"", "", -1, "signal: killed", "signal: killed"}},
		{"stdin defaults to open", "", &process.StartRequest{Process: bash("test -p /dev/stdin && echo pipe")},
			want{"pipe\n", "", 0, "exit status 0", ""}},
		{"stdin false is /dev/null", "", &process.StartRequest{Process: bash("cat; echo done"), Stdin: ptr(false)},
			want{"done\n", "", 0, "exit status 0", ""}},
	}
	for _, c := range codecs {
		t.Run(c.name, func(t *testing.T) {
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					pc := e.process(tt.user, c.opts)
					s, err := pc.Start(ctxTimeout(t, time.Minute), connect.NewRequest(tt.req))
					if err != nil {
						t.Fatal(err)
					}
					r, err := collect(s, nil)
					if err != nil {
						t.Fatal(err)
					}
					if r.firstNotStart || r.pid == 0 {
						t.Fatalf("first event not start with a pid: %+v", r)
					}
					if r.end == nil {
						t.Fatalf("no end event: %+v", r)
					}
					got := want{r.stdout, r.stderr, r.end.GetExitCode(), r.end.GetStatus(), r.end.GetError()}
					if got != tt.want {
						t.Errorf("got %+v\nwant %+v", got, tt.want)
					}
					if r.end.GetExited() != (tt.want.code >= 0) {
						t.Errorf("exited = %v for exit code %d", r.end.GetExited(), tt.want.code)
					}
				})
			}
		})
	}
}

func TestProcessErrors(t *testing.T) {
	e := newEnv(t, sandboxOpts())
	for _, c := range codecs {
		t.Run(c.name, func(t *testing.T) {
			tests := []struct {
				name string
				call func(ctx context.Context) error
				code connect.Code
			}{
				{"missing cwd", func(ctx context.Context) error {
					s, err := e.process("", c.opts).Start(ctx, connect.NewRequest(&process.StartRequest{
						Process: &process.ProcessConfig{Cmd: "/bin/true", Cwd: ptr("/no/such/dir")}}))
					if err != nil {
						return err
					}
					_, err = collect(s, nil)
					if err != nil && !strings.Contains(err.Error(), "cwd '/no/such/dir' does not exist") {
						t.Errorf("message: %v", err)
					}
					return err
				}, connect.CodeInvalidArgument},
				{"command larger than execve takes", func(ctx context.Context) error {
					s, err := e.process("", c.opts).Start(ctx, connect.NewRequest(&process.StartRequest{Process: bash("echo " + strings.Repeat("x", 300<<10))}))
					if err != nil {
						return err
					}
					_, err = collect(s, nil)
					return err
				}, connect.CodeInvalidArgument},
				{"unknown user", func(ctx context.Context) error {
					s, err := e.process("nobody", c.opts).Start(ctx, connect.NewRequest(&process.StartRequest{Process: bash("true")}))
					if err != nil {
						return err
					}
					_, err = collect(s, nil)
					return err
				}, connect.CodeUnauthenticated},
				{"connect to unknown pid", func(ctx context.Context) error {
					s, err := e.process("", c.opts).Connect(ctx, connect.NewRequest(&process.ConnectRequest{
						Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: 999999}}}))
					if err != nil {
						return err
					}
					_, err = collect(s, nil)
					return err
				}, connect.CodeNotFound},
				{"connect to unknown tag", func(ctx context.Context) error {
					s, err := e.process("", c.opts).Connect(ctx, connect.NewRequest(&process.ConnectRequest{
						Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Tag{Tag: "no-such-tag"}}}))
					if err != nil {
						return err
					}
					_, err = collect(s, nil)
					return err
				}, connect.CodeNotFound},
				{"input to unknown pid", func(ctx context.Context) error {
					_, err := e.process("", c.opts).SendInput(ctx, connect.NewRequest(&process.SendInputRequest{
						Process: pidSel(999999), Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("x")}}}))
					return err
				}, connect.CodeNotFound},
				{"signal to unknown pid", func(ctx context.Context) error {
					_, err := e.process("", c.opts).SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{
						Process: pidSel(999999), Signal: process.Signal_SIGNAL_SIGKILL}))
					return err
				}, connect.CodeNotFound},
				{"unspecified signal", func(ctx context.Context) error {
					_, err := e.process("", c.opts).SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: pidSel(1)}))
					return err
				}, connect.CodeInvalidArgument},
				{"no selector", func(ctx context.Context) error {
					_, err := e.process("", c.opts).CloseStdin(ctx, connect.NewRequest(&process.CloseStdinRequest{}))
					return err
				}, connect.CodeInvalidArgument},
			}
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					wantCode(t, tt.call(ctxTimeout(t, time.Minute)), tt.code)
				})
			}
		})
	}
}

func pidSel(pid uint32) *process.ProcessSelector {
	return &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}
}

// TestProcessBackground is the SDK's background flow: start, detach,
// find it in List, re-attach by tag, send input, kill it, and see the
// end event on the re-attached stream.
func TestProcessBackground(t *testing.T) {
	e := newEnv(t, sandboxOpts())
	for _, c := range codecs {
		t.Run(c.name, func(t *testing.T) {
			pc := e.process("", c.opts)
			tag := "bg-" + c.name
			ctx, detach := context.WithCancel(ctxTimeout(t, time.Minute))
			s, err := pc.Start(ctx, connect.NewRequest(&process.StartRequest{
				Process: bash("read line; echo got:$line; sleep 600"), Tag: ptr(tag), Stdin: ptr(true)}))
			if err != nil {
				t.Fatal(err)
			}
			if !s.Receive() || s.Msg().GetEvent().GetStart().GetPid() == 0 {
				t.Fatalf("no start event: %v", s.Err())
			}
			pid := s.Msg().GetEvent().GetStart().GetPid()
			detach()
			s.Close()

			ctx = ctxTimeout(t, time.Minute)
			list, err := pc.List(ctx, connect.NewRequest(&process.ListRequest{}))
			if err != nil {
				t.Fatal(err)
			}
			var found *process.ProcessInfo
			for _, p := range list.Msg.GetProcesses() {
				if p.GetPid() == pid {
					found = p
				}
			}
			if found == nil || found.GetTag() != tag || found.GetConfig().GetCmd() != "/bin/bash" ||
				strings.Join(found.GetConfig().GetArgs(), " ") != "-l -c read line; echo got:$line; sleep 600" {
				t.Fatalf("List = %v, want pid %d with tag %s", list.Msg.GetProcesses(), pid, tag)
			}

			cs, err := pc.Connect(ctx, connect.NewRequest(&process.ConnectRequest{
				Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Tag{Tag: tag}}}))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := pc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: pidSel(pid),
				Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("hi\n")}}})); err != nil {
				t.Fatal(err)
			}
			killed := false
			r, err := collect(cs, func(r run) {
				if !killed && strings.Contains(r.stdout, "got:hi") {
					killed = true
					if _, err := pc.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{
						Process: pidSel(pid), Signal: process.Signal_SIGNAL_SIGKILL})); err != nil {
						t.Error(err)
					}
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			if r.firstNotStart || r.pid != pid || r.stdout != "got:hi\n" || r.end == nil ||
				r.end.GetExitCode() != -1 || r.end.GetStatus() != "signal: killed" || r.end.GetExited() {
				t.Fatalf("connected stream = %+v (end %v)", r, r.end)
			}
			_, err = pc.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: pidSel(pid), Signal: process.Signal_SIGNAL_SIGKILL}))
			wantCode(t, err, connect.CodeNotFound) // the SDK's kill() then says false

			// The ended process's output and end are retained for a
			// late Connect by pid; a tag names running processes only.
			cs, err = pc.Connect(ctx, connect.NewRequest(&process.ConnectRequest{Process: pidSel(pid)}))
			if err != nil {
				t.Fatal(err)
			}
			r, err = collect(cs, nil)
			if err != nil || r.pid != pid || r.stdout != "got:hi\n" || r.end.GetStatus() != "signal: killed" {
				t.Fatalf("late connect = %+v (end %v), %v", r, r.end, err)
			}
			cs, err = pc.Connect(ctx, connect.NewRequest(&process.ConnectRequest{
				Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Tag{Tag: tag}}}))
			if err == nil {
				_, err = collect(cs, nil)
			}
			wantCode(t, err, connect.CodeNotFound)
		})
	}
}

// TestProcessStdin covers SendInput, CloseStdin and the client-streaming
// StreamInput (over HTTP/1.1, as the test server speaks).
func TestProcessStdin(t *testing.T) {
	e := newEnv(t, sandboxOpts())
	for _, c := range codecs {
		t.Run(c.name, func(t *testing.T) {
			for _, streamed := range []bool{false, true} {
				name := map[bool]string{false: "SendInput", true: "StreamInput"}[streamed]
				t.Run(name, func(t *testing.T) {
					pc := e.process("", c.opts)
					ctx := ctxTimeout(t, time.Minute)
					s, err := pc.Start(ctx, connect.NewRequest(&process.StartRequest{Process: bash("wc -c; echo end"), Stdin: ptr(true)}))
					if err != nil {
						t.Fatal(err)
					}
					if !s.Receive() {
						t.Fatal(s.Err())
					}
					pid := s.Msg().GetEvent().GetStart().GetPid()
					in := func(b string) *process.ProcessInput {
						return &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte(b)}}
					}
					if streamed {
						cs := pc.StreamInput(ctx)
						msgs := []*process.StreamInputRequest{
							{Event: &process.StreamInputRequest_Start{Start: &process.StreamInputRequest_StartEvent{Process: pidSel(pid)}}},
							{Event: &process.StreamInputRequest_Data{Data: &process.StreamInputRequest_DataEvent{Input: in("abc")}}},
							{Event: &process.StreamInputRequest_Keepalive{Keepalive: &process.StreamInputRequest_KeepAlive{}}},
							{Event: &process.StreamInputRequest_Data{Data: &process.StreamInputRequest_DataEvent{Input: in("defg")}}},
						}
						for _, m := range msgs {
							if err := cs.Send(m); err != nil {
								t.Fatal(err)
							}
						}
						if _, err := cs.CloseAndReceive(); err != nil {
							t.Fatal(err)
						}
					} else {
						for _, b := range []string{"abc", "defg"} {
							if _, err := pc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: pidSel(pid), Input: in(b)})); err != nil {
								t.Fatal(err)
							}
						}
					}
					if _, err := pc.CloseStdin(ctx, connect.NewRequest(&process.CloseStdinRequest{Process: pidSel(pid)})); err != nil {
						t.Fatal(err)
					}
					r, err := collect(s, nil)
					if err != nil {
						t.Fatal(err)
					}
					if r.stdout != "7\nend\n" || r.end.GetExitCode() != 0 {
						t.Fatalf("got %+v", r)
					}
				})
			}
		})
	}
}

// TestProcessLargeInput: input larger than one agent call carries.
func TestProcessLargeInput(t *testing.T) {
	e := newEnv(t, sandboxOpts())
	for _, c := range codecs {
		t.Run(c.name, func(t *testing.T) {
			pc := e.process("", c.opts)
			ctx := ctxTimeout(t, time.Minute)
			s, err := pc.Start(ctx, connect.NewRequest(&process.StartRequest{Process: bash("wc -c"), Stdin: ptr(true)}))
			if err != nil || !s.Receive() {
				t.Fatal(err, s.Err())
			}
			pid := s.Msg().GetEvent().GetStart().GetPid()
			big := strings.Repeat("0123456789abcdef", 1<<16) // 1 MiB
			if _, err := pc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: pidSel(pid),
				Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte(big)}}})); err != nil {
				t.Fatal(err)
			}
			if _, err := pc.CloseStdin(ctx, connect.NewRequest(&process.CloseStdinRequest{Process: pidSel(pid)})); err != nil {
				t.Fatal(err)
			}
			r, err := collect(s, nil)
			if err != nil || r.stdout != "1048576\n" {
				t.Fatalf("got %+v, %v", r, err)
			}
		})
	}
}

func TestProcessPTY(t *testing.T) {
	e := newEnv(t, sandboxOpts())
	for _, c := range codecs {
		t.Run(c.name, func(t *testing.T) {
			pc := e.process("", c.opts)
			ctx := ctxTimeout(t, time.Minute)
			s, err := pc.Start(ctx, connect.NewRequest(&process.StartRequest{
				Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", `stty size; read x; stty size; echo "got:$x"`},
					Envs: map[string]string{"TERM": "xterm-256color"}},
				Pty: &process.PTY{Size: &process.PTY_Size{Cols: 100, Rows: 30}},
			}))
			if err != nil {
				t.Fatal(err)
			}
			var pid uint32
			sent := false
			r, err := collect(s, func(r run) {
				pid = r.pid
				if !sent && strings.Contains(r.pty, "30 100") {
					sent = true
					if _, err := pc.Update(ctx, connect.NewRequest(&process.UpdateRequest{Process: pidSel(pid),
						Pty: &process.PTY{Size: &process.PTY_Size{Cols: 120, Rows: 40}}})); err != nil {
						t.Error(err)
					}
					if _, err := pc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: pidSel(pid),
						Input: &process.ProcessInput{Input: &process.ProcessInput_Pty{Pty: []byte("hi\n")}}})); err != nil {
						t.Error(err)
					}
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			if r.stdout != "" || r.stderr != "" || !strings.Contains(r.pty, "40 120") || !strings.Contains(r.pty, "got:hi") || r.end.GetExitCode() != 0 {
				t.Fatalf("got %+v", r)
			}
		})
	}
}

// TestProcessTimeout: the request's deadline (Connect-Timeout-Ms) is the
// process's lifetime, as in envd; keepalives flow while it is quiet.
func TestProcessTimeout(t *testing.T) {
	e := newEnv(t, sandboxOpts())
	pc := e.process("", codecs[0].opts)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	req := connect.NewRequest(&process.StartRequest{Process: bash("echo started; sleep 600"), Tag: ptr("timeout")})
	req.Header().Set("Keepalive-Ping-Interval", "1")
	s, err := pc.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	r, err := collect(s, nil)
	wantCode(t, err, connect.CodeDeadlineExceeded)
	if r.stdout != "started\n" || r.keepalives == 0 {
		t.Errorf("got %+v before the deadline, want output and keepalives", r)
	}
	// The process was killed with the deadline.
	ctx = ctxTimeout(t, time.Minute)
	for {
		list, err := pc.List(ctx, connect.NewRequest(&process.ListRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		alive := false
		for _, p := range list.Msg.GetProcesses() {
			alive = alive || p.GetTag() == "timeout"
		}
		if !alive {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the process outlived its deadline")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatal("timed out")
	}
}
