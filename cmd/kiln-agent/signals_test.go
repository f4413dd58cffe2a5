package main

import (
	"context"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kiln-sh/kiln/internal/agentapi/channel"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
)

// ping fails the test unless the agent answers within 10 s.
func (a *agentProc) ping(t *testing.T, after string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var pong wire.Pong
	if err := a.conn.Invoke(ctx, wire.MethodPing, nil, &pong); err != nil {
		t.Fatalf("ping after %s: %v", after, err)
	}
}

// Every catchable signal but the stop signals is caught and dropped by an
// agent that is not PID 1; before, HUP/PIPE aside, each ended it (QUIT,
// ABRT, ILL, SEGV... with a stack dump).
func TestBinaryIgnoresSignals(t *testing.T) {
	a := startAgent(t)
	for _, sig := range hostileSignals {
		if isStopSignal(sig) {
			continue
		}
		if err := a.cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		a.ping(t, sig.String())
	}
}

// As PID 1 (here of a new PID namespace, as in a sandbox) the agent
// ignores every catchable signal, the stop signals too: only code in the
// sandbox can send them.
func TestBinaryPID1IgnoresSignals(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("needs root (a new PID namespace)")
		}
		t.Skip("needs root (a new PID namespace)")
	}
	bin, err := buildAgent()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "KILN_SANDBOX_ID=sbx-test")
	cmd.Stderr = t.Output()
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	w, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	r, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := channel.Connect(ctx, r, w)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	a := &agentProc{cmd: cmd, conn: conn}
	// From inside its namespace, as code in a sandbox would: as root,
	// kill(1, sig) from a child of the agent.
	for _, sig := range hostileSignals {
		out, st := a.exec(t, wire.ExecParams{Args: []string{"kill", "-s", signalName(sig), "1"}, User: wire.UserRoot})
		if st.Code != 0 {
			t.Fatalf("kill -%s 1: %+v %q", signalName(sig), st, out)
		}
		a.ping(t, signalName(sig))
	}
}

func signalName(sig os.Signal) string {
	return unixSignalName(sig.(syscall.Signal))
}

func unixSignalName(s syscall.Signal) string {
	n := unix.SignalName(s)
	return n[len("SIG"):]
}
