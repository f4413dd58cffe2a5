package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/channel"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
)

// buildDir holds the binary built for this test run.
var buildDir string

func TestMain(m *testing.M) {
	var err error
	if buildDir, err = os.MkdirTemp("", "kiln-agent-test"); err != nil {
		panic(err)
	}
	code := m.Run()
	os.RemoveAll(buildDir)
	os.Exit(code)
}

// buildAgent builds the real static binary once per test run.
var buildAgent = sync.OnceValues(func() (string, error) {
	dir := buildDir
	bin := filepath.Join(dir, "kiln-agent")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", errors.New("building kiln-agent: " + err.Error() + "\n" + string(out))
	}
	return bin, nil
})

type agentProc struct {
	cmd  *exec.Cmd
	conn *channel.Conn
}

// startAgent runs the binary as a subprocess (not PID 1: it becomes a
// child subreaper) and connects to it over its stdin and stdout.
func startAgent(t *testing.T) *agentProc {
	t.Helper()
	bin, err := buildAgent()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "KILN_SANDBOX_ID=sbx-test", "KILN_OUTPUT_LIMIT=1048576", "KILN_LOG_LEVEL=debug")
	cmd.Stderr = t.Output()
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
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := channel.Connect(ctx, r, w)
	if err != nil {
		cmd.Process.Kill()
		t.Fatal(err)
	}
	a := &agentProc{cmd: cmd, conn: conn}
	t.Cleanup(func() {
		conn.Close()
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	})
	return a
}

func (a *agentProc) exec(t *testing.T, p wire.ExecParams) (string, api.ExitStatus) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := a.conn.Call(ctx, wire.MethodExec, p)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var out strings.Builder
	for {
		f, err := st.Recv(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("exec %v: %v", p, err)
		}
		var ev api.Event
		json.Unmarshal(f.Payload, &ev)
		out.Write(ev.Data)
	}
	var status api.ExitStatus
	if err := st.Wait(ctx, &status); err != nil {
		t.Fatal(err)
	}
	return out.String(), status
}

func TestVersion(t *testing.T) {
	bin, err := buildAgent()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil || !strings.HasPrefix(string(out), "kiln-agent ") {
		t.Errorf("--version: %q, %v", out, err)
	}
}

func TestBinaryExec(t *testing.T) {
	a := startAgent(t)
	out, st := a.exec(t, wire.ExecParams{Cmd: "env; exit 5"})
	// Commands see their sandbox's id and no other KILN_ variable.
	kiln := strings.Count(out, "KILN_")
	if st.Code != 5 || kiln != 1 || !strings.Contains(out, "\nKILN_SANDBOX_ID=sbx-test\n") || !strings.Contains(out, "LANG=C.UTF-8") {
		t.Errorf("env = %q, status %+v", out, st)
	}
	// The configured output limit applies.
	out, st = a.exec(t, wire.ExecParams{Args: []string{"head", "-c", "3000000", "/dev/zero"}})
	if len(out) != 1<<20 || !st.Truncated {
		t.Errorf("delivered %d bytes, status %+v", len(out), st)
	}
}

// Exit statuses reach the right process when many children exit at
// once through the single wait4(-1) reaper.
func TestBinaryReapsConcurrently(t *testing.T) {
	a := startAgent(t)
	var wg sync.WaitGroup
	for i := range 30 {
		wg.Go(func() {
			out, st := a.exec(t, wire.ExecParams{Args: []string{"sh", "-c", "echo " + strconv.Itoa(i) + "; exit " + strconv.Itoa(i)}})
			if st.Code != i || out != strconv.Itoa(i)+"\n" {
				t.Errorf("process %d: %q, %+v", i, out, st)
			}
		})
	}
	wg.Wait()
}

// Orphans are re-parented to the agent and reaped: no zombies remain.
func TestBinaryReapsOrphans(t *testing.T) {
	a := startAgent(t)
	a.exec(t, wire.ExecParams{Cmd: "for i in 1 2 3 4 5; do (sleep 0.1 &); done"})
	pid := a.cmd.Process.Pid
	deadline := time.Now().Add(3 * time.Second)
	for {
		zombies, children := 0, 0
		dirs, _ := os.ReadDir("/proc")
		for _, d := range dirs {
			b, err := os.ReadFile(filepath.Join("/proc", d.Name(), "stat"))
			if err != nil {
				continue
			}
			f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
			if len(f) > 1 && f[1] == strconv.Itoa(pid) {
				children++
				if f[0] == "Z" {
					zombies++
				}
			}
		}
		if children == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent still has %d children, %d of them zombies", children, zombies)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// SIGTERM stops the agent cleanly and takes its processes with it.
func TestBinarySIGTERM(t *testing.T) {
	a := startAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := a.conn.Call(ctx, wire.MethodExec, wire.ExecParams{Args: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	f, err := st.Recv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var start api.Event
	json.Unmarshal(f.Payload, &start)
	st.Close()
	a.cmd.Process.Signal(syscall.SIGTERM)
	if err := a.cmd.Wait(); err != nil {
		t.Errorf("agent exited with %v, want 0", err)
	}
	if err := syscall.Kill(start.PID, 0); err == nil {
		t.Errorf("process %d survived the agent", start.PID)
	}
}
