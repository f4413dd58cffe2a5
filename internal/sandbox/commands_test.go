package sandbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/sandbox/sandboxtest"
)

func TestCommands(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		m := newManager(t, testConfig(t))
		e := create(t, m, sandbox.CreateOptions{Runtime: rt, Env: map[string]string{"GREETING": "hello"}})

		tests := []struct {
			name       string
			p          wire.ExecParams
			wantOut    string
			wantStderr string
			wantCode   int
		}{
			{"argv", wire.ExecParams{Args: []string{"echo", "a b", "c"}}, "a b c\n", "", 0},
			{"shell", wire.ExecParams{Cmd: "echo $((6*7)) | tr 4 x"}, "x2\n", "", 0},
			{"exit code", wire.ExecParams{Cmd: "echo oops >&2; exit 3"}, "", "oops\n", 3},
			{"sandbox env", wire.ExecParams{Cmd: "echo $GREETING"}, "hello\n", "", 0},
			{"command env", wire.ExecParams{Cmd: "echo $GREETING $X", Env: map[string]string{"X": "y", "GREETING": "hi"}}, "hi y\n", "", 0},
			{"only its own id of kiln env", wire.ExecParams{Cmd: "env | grep ^KILN_ | sed s/=.*//"}, "KILN_SANDBOX_ID\n", "", 0},
			{"default user and home", wire.ExecParams{Cmd: "id -u; pwd; echo $HOME"}, "1000\n/home/user\n/home/user\n", "", 0},
			{"root", wire.ExecParams{Cmd: "id -u", User: wire.UserRoot}, "0\n", "", 0},
			{"cwd", wire.ExecParams{Cmd: "pwd", Cwd: "/tmp"}, "/tmp\n", "", 0},
			{"python", wire.ExecParams{Args: []string{"python3", "-c", "print(sum(range(10)))"}}, "45\n", "", 0},
			{"coreutils stat", wire.ExecParams{Cmd: "ls -l /usr >/dev/null && stat -c %U /home/user"}, "user\n", "", 0},
			{"writable tmp", wire.ExecParams{Cmd: "python3 -c 'import tempfile; tempfile.mkstemp(); print(1)'"}, "1\n", "", 0},
			{"missing binary", wire.ExecParams{Args: []string{"/no/such/binary"}}, "", "", -1},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				e := sandboxtest.Wrap(t, e.M, e.SB, e.Agent)
				if tt.wantCode == -1 {
					_, err := e.Agent.Exec(context.Background(), tt.p, func(api.Event) error { return nil })
					if err == nil {
						t.Fatal("exec of a missing binary succeeded")
					}
					return
				}
				r := e.Exec(tt.p)
				if r.Stdout != tt.wantOut || r.Stderr != tt.wantStderr || r.Exit.Code != tt.wantCode {
					t.Errorf("got stdout %q stderr %q exit %+v; want %q %q %d", r.Stdout, r.Stderr, r.Exit, tt.wantOut, tt.wantStderr, tt.wantCode)
				}
			})
		}

		t.Run("events are ordered", func(t *testing.T) {
			r := e.Sh("for i in 1 2 3; do echo $i; sleep 0.05; done")
			if r.Events[0].Type != api.EventStart || r.Events[len(r.Events)-1].Type != api.EventExit {
				t.Fatalf("events %+v: want start first and exit last", r.Events)
			}
			for i, ev := range r.Events {
				if ev.Seq != uint64(i+1) {
					t.Fatalf("event %d has seq %d", i, ev.Seq)
				}
			}
		})

		t.Run("stdin", func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			pidc := make(chan int, 1)
			var out strings.Builder
			done := make(chan *api.ExitStatus, 1)
			go func() {
				exit, err := e.Agent.Exec(ctx, wire.ExecParams{Args: []string{"cat"}, Stdin: true}, func(ev api.Event) error {
					if ev.Type == api.EventStart {
						pidc <- ev.PID
					}
					out.Write(ev.Data)
					return nil
				})
				if err != nil {
					t.Error(err)
				}
				done <- exit
			}()
			pid := <-pidc
			if err := e.Agent.Stdin(ctx, wire.StdinParams{PID: pid, Data: []byte("ping\n")}); err != nil {
				t.Fatal(err)
			}
			if err := e.Agent.Stdin(ctx, wire.StdinParams{PID: pid, Close: true}); err != nil {
				t.Fatal(err)
			}
			if exit := <-done; exit == nil || exit.Code != 0 || out.String() != "ping\n" {
				t.Fatalf("cat: exit %+v output %q", exit, out.String())
			}
		})

		t.Run("timeout kills the tree", func(t *testing.T) {
			start := time.Now()
			r := e.Exec(wire.ExecParams{Cmd: "sleep 300 & echo $! > /tmp/child; sleep 300", TimeoutMs: 1000})
			if r.Exit.Reason != api.ExitTimeout {
				t.Fatalf("exit %+v, want reason timeout", r.Exit)
			}
			if d := time.Since(start); d > 20*time.Second {
				t.Errorf("timeout took %v", d)
			}
			chk := e.Sh("kill -0 $(cat /tmp/child) 2>/dev/null && echo alive || echo dead")
			if strings.TrimSpace(chk.Stdout) != "dead" {
				t.Errorf("child of timed-out command is %s", chk.Stdout)
			}
		})

		t.Run("signal", func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			pidc := make(chan int, 1)
			go func() {
				exit, err := e.Agent.Exec(ctx, wire.ExecParams{Args: []string{"sleep", "300"}}, func(ev api.Event) error {
					if ev.Type == api.EventStart {
						pidc <- ev.PID
					}
					return nil
				})
				if err != nil || exit.Signal != "SIGTERM" {
					t.Errorf("after SIGTERM: exit %+v, err %v", exit, err)
				}
				pidc <- 0
			}()
			pid := <-pidc
			if err := e.Agent.Signal(ctx, wire.SignalParams{PID: pid, Signal: "SIGTERM"}); err != nil {
				t.Fatal(err)
			}
			<-pidc
			if err := e.Agent.Signal(ctx, wire.SignalParams{PID: 999999, Signal: "SIGTERM"}); err == nil {
				t.Error("signal to an unknown pid succeeded")
			}
		})

		t.Run("background and re-attach", func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			pidc := make(chan int, 1)
			go e.Agent.Exec(ctx, wire.ExecParams{Cmd: "echo one; sleep 1; echo two", Tag: "bg"}, func(ev api.Event) error {
				if ev.Type == api.EventStart {
					pidc <- ev.PID
				}
				return nil
			})
			pid := <-pidc
			cancel() // detach; the process keeps running
			ps, err := e.Agent.Processes(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, p := range ps {
				found = found || (p.PID == pid && p.Tag == "bg")
			}
			if !found {
				t.Errorf("process %d not listed: %+v", pid, ps)
			}
			var out strings.Builder
			actx, acancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer acancel()
			exit, err := e.Agent.Attach(actx, wire.AttachParams{PID: pid}, func(ev api.Event) error {
				out.Write(ev.Data)
				return nil
			})
			if err != nil || exit.Code != 0 || out.String() != "one\ntwo\n" {
				t.Fatalf("attach: %q, exit %+v, err %v", out.String(), exit, err)
			}
		})

		t.Run("pty", func(t *testing.T) {
			r := e.Exec(wire.ExecParams{Cmd: "tty; stty size", PTY: &wire.PTYSize{Cols: 100, Rows: 30}})
			if !strings.Contains(r.Stdout, "/dev/pts/") || !strings.Contains(r.Stdout, "30 100") {
				t.Errorf("pty output %q", r.Stdout)
			}
		})
	})
}

func TestOutputFloodIsCapped(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		m := newManager(t, testConfig(t))
		e := create(t, m, sandbox.CreateOptions{Runtime: rt})
		const limit = 4 << 20
		var got int
		exit, err := e.Agent.Exec(context.Background(), wire.ExecParams{
			Cmd: "head -c 1G /dev/zero; echo done >&2", OutputLimit: limit, TimeoutMs: 120_000,
		}, func(ev api.Event) error {
			got += len(ev.Data)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if !exit.Truncated || got > limit+64<<10 {
			t.Fatalf("1 GB flood: delivered %d bytes, exit %+v; want truncated at %d", got, exit, limit)
		}
		if r := e.Sh("echo still usable"); r.Stdout != "still usable\n" {
			t.Fatalf("after flood: %q", r.Stdout)
		}
	})
}

func TestAgentCallsOnDeadSandbox(t *testing.T) {
	m := newManager(t, testConfig(t))
	e := create(t, m, sandbox.CreateOptions{Runtime: "runc"})
	if err := m.Kill(context.Background(), e.SB.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Agent(e.SB.ID); err == nil {
		t.Fatal("Agent of a killed sandbox succeeded")
	}
	if err := e.Agent.Ping(context.Background()); err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ping on a killed sandbox: %v, want a prompt unavailable error", err)
	}
}
