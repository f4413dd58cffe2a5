package sudo

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kiln-sh/kiln/internal/agent/process"
)

// clientSocketVar makes the test binary the sudo client of that socket.
const clientSocketVar = "KILN_SUDO_TEST_SOCKET"

func TestMain(m *testing.M) {
	if path := os.Getenv(clientSocketVar); path != "" {
		code, err := run(path, os.Args[1:])
		if err != nil {
			fmt.Fprintln(os.Stderr, "sudo:", err)
		}
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// startBroker serves a broker on a socket of its own until the test ends;
// allowed nil allows every uid.
func startBroker(t *testing.T, allowed func(uint32) bool) string {
	t.Helper()
	if allowed == nil {
		allowed = func(uint32) bool { return true }
	}
	table := process.NewTable(process.Options{})
	t.Cleanup(func() { _ = table.Close(context.Background()) })
	path := filepath.Join(t.TempDir(), "kiln", "sudo.sock")
	users := map[string]process.User{
		"root": {Name: "root", Home: "/root", Shell: "/bin/sh"},
		"0":    {Name: "root", Home: "/root", Shell: "/bin/sh"},
	}
	b := &Broker{Path: path, PathDir: "/nonexistent-sudo-dir", Start: table.Spawn, Allowed: allowed,
		RequestTimeout: time.Second,
		Lookup: func(name string) (process.User, error) {
			if u, ok := users[name]; ok {
				return u, nil
			}
			return process.User{}, errors.New("no such user")
		}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			return path
		}
		if time.Now().After(deadline) {
			t.Fatal("the broker did not listen")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// sudo runs the real client (this test binary) with args and stdin.
func sudo(t *testing.T, path, dir, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), clientSocketVar+"="+path, "KEEP=kept")
	cmd.Dir = dir
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("running the client: %v", err)
	}
	return out.String(), errb.String(), cmd.ProcessState.ExitCode()
}

func requireRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("needs root")
		}
		t.Skip("needs root")
	}
}

func TestBrokerRunsCommands(t *testing.T) {
	requireRoot(t)
	path := startBroker(t, nil)
	dir := t.TempDir()
	for _, c := range []struct {
		args      []string
		stdin     string
		stdout    string
		exit      int
		stderrHas string
	}{
		{args: []string{"id", "-u"}, stdout: "0\n"},
		{args: []string{"cat"}, stdin: "hi\n", stdout: "hi\n"},
		{args: []string{"pwd"}, stdout: dir + "\n"},
		{args: []string{"sh", "-c", "echo oops >&2; exit 7"}, exit: 7, stderrHas: "oops"},
		{args: []string{"sh", "-c", "kill -KILL $$"}, exit: 128 + 9},
		{args: []string{"-E", "sh", "-c", "echo $KEEP"}, stdout: "kept\n"},
		{args: []string{"sh", "-c", "echo ${KEEP:-reset} $SUDO_UID $PATH"},
			stdout: "reset " + strconv.Itoa(os.Getuid()) + " /nonexistent-sudo-dir:" + process.DefaultPath + "\n"},
		{args: []string{"-u", "#0", "-s", "echo", "$HOME"}, stdout: "/root\n"},
		{args: []string{"-v"}},
		{args: []string{"-Z", "id"}, exit: 1, stderrHas: "sudo: unknown option -Z"},
		{args: []string{"-u", "nobody-here", "id"}, exit: 1, stderrHas: `sudo: unknown user "nobody-here"`},
		{args: []string{"no-such-command-x"}, exit: 1, stderrHas: "sudo: no-such-command-x: command not found"},
	} {
		stdout, stderr, code := sudo(t, path, dir, c.stdin, c.args...)
		if code != c.exit || stdout != c.stdout && c.stdout != "" || !strings.Contains(stderr, c.stderrHas) {
			t.Errorf("sudo %q: exit %d, stdout %q, stderr %q; want exit %d, stdout %q, stderr with %q",
				c.args, code, stdout, stderr, c.exit, c.stdout, c.stderrHas)
		}
	}
}

// The policy gets the caller's uid from the kernel (SO_PEERCRED) and a
// refusal runs nothing.
func TestBrokerPolicy(t *testing.T) {
	requireRoot(t)
	asked := make(chan uint32, 1)
	path := startBroker(t, func(uid uint32) bool { asked <- uid; return false })
	marker := filepath.Join(t.TempDir(), "ran")
	_, stderr, code := sudo(t, path, "/", "", "touch", marker)
	if code != 1 || !strings.Contains(stderr, "is not allowed to run sudo in this sandbox") {
		t.Errorf("refused sudo: exit %d, stderr %q", code, stderr)
	}
	if uid := <-asked; uid != uint32(os.Getuid()) {
		t.Errorf("policy asked about uid %d, want %d", uid, os.Getuid())
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("a refused command ran")
	}
}

// rawRequest sends a request frame with the given descriptors on a new
// connection, as a hostile client might.
func rawRequest(t *testing.T, path string, payload []byte, fds []int) *net.UnixConn {
	t.Helper()
	conn, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	c := conn.(*net.UnixConn)
	t.Cleanup(func() { c.Close() })
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := c.WriteMsgUnix(payload, oob, nil); err != nil {
		t.Fatal(err)
	}
	return c
}

// readReply reads the broker's reply, or reports that it closed the
// connection without one.
func readReply(t *testing.T, c *net.UnixConn) (reply, error) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(60 * time.Second))
	var rep reply
	err := readFrame(c, nil, maxFrame, &rep)
	return rep, err
}

// Garbage, oversized, truncated and descriptor-less requests are refused
// with an error (or the connection closed), and the broker serves on.
func TestBrokerRefusesBadInput(t *testing.T) {
	requireRoot(t)
	path := startBroker(t, nil)
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	n := int(null.Fd())
	three := []int{n, n, n}
	huge := binary.BigEndian.AppendUint32(nil, 0xffffffff)
	overLimit := binary.BigEndian.AppendUint32(nil, maxRequest+1)
	for _, c := range []struct {
		name    string
		payload []byte
		fds     []int
		want    string // in the reply's error; "" accepts a closed connection
	}{
		{"garbage, no descriptors", []byte("GET / HTTP/1.1\r\n\r\n"), nil, "got 0 descriptors"},
		{"too few descriptors", frame([]byte(`{"args":["id"],"cwd":"/"}`)), []int{n}, "got 1 descriptors"},
		{"too many descriptors", frame([]byte(`{"args":["id"],"cwd":"/"}`)), []int{n, n, n, n}, "descriptors"},
		{"length over 4 GiB", huge, three, "message too large"},
		{"length over the limit", overLimit, three, "message too large"},
		{"not JSON", frame([]byte("\x00\x01garbage")), three, "decoding message"},
		{"wrong JSON", frame([]byte(`{"args":"id","env":7}`)), three, "decoding message"},
		{"truncated, then silent", []byte{0, 0, 1, 0, '{'}, three, "bad request"},
		{"relative cwd", frame([]byte(`{"args":["id"],"cwd":"etc"}`)), three, "unable to change directory"},
		{"NUL in an argument", frame([]byte(`{"args":["i\u0000d"],"cwd":"/"}`)), three, "NUL byte"},
		{"no arguments", frame([]byte(`{}`)), three, "no command given"},
	} {
		c2 := rawRequest(t, path, c.payload, c.fds)
		rep, err := readReply(t, c2)
		switch {
		case err != nil && c.want != "":
			t.Errorf("%s: no reply: %v", c.name, err)
		case err == nil && (rep.Exit != 1 || !strings.Contains(rep.Error, c.want)):
			t.Errorf("%s: reply %+v, want exit 1 and an error with %q", c.name, rep, c.want)
		}
		c2.Close()
	}
	// A client that connects and sends nothing is dropped at the deadline.
	idle, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	_ = idle.SetReadDeadline(time.Now().Add(60 * time.Second))
	if _, err := idle.Read(make([]byte, 64<<10)); err == nil {
		// The reply to an idle client is an error, then EOF.
		if _, err := idle.Read(make([]byte, 1)); err == nil {
			t.Error("an idle client was not dropped")
		}
	} else if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Error("an idle client was not dropped within 60 s")
	}
	if stdout, stderr, code := sudo(t, path, "/", "", "id", "-u"); code != 0 || stdout != "0\n" {
		t.Errorf("after bad input: exit %d, %q %q", code, stdout, stderr)
	}
}

// A client that goes away mid-command takes its command with it (the
// whole process group), and the broker serves on.
func TestBrokerKillsCommandOfLostClient(t *testing.T) {
	requireRoot(t)
	path := startBroker(t, nil)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	body := []byte(`{"args":["sh","-c","sleep 1000 & echo $$ $!; wait"],"cwd":"/","env":["PATH=/usr/bin:/bin"]}`)
	c := rawRequest(t, path, frame(body), []int{int(null.Fd()), int(w.Fd()), int(w.Fd())})
	w.Close()
	var shell, sleeper int
	if _, err := fmt.Fscan(r, &shell, &sleeper); err != nil {
		t.Fatalf("reading the command's pids: %v", err)
	}
	c.Close()
	deadline := time.Now().Add(60 * time.Second)
	for _, pid := range []int{shell, sleeper} {
		for alive(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("pid %d still runs 60 s after its client went away", pid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if stdout, stderr, code := sudo(t, path, "/", "", "id", "-u"); code != 0 || stdout != "0\n" {
		t.Errorf("after a lost client: exit %d, %q %q", code, stdout, stderr)
	}
}

// alive reports whether pid runs (a zombie does not).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || b[i+2] != 'Z'
}

// The client forwards the signals it gets to its command.
func TestClientForwardsSignals(t *testing.T) {
	requireRoot(t)
	path := startBroker(t, nil)
	cmd := exec.Command(os.Args[0], "sh", "-c", "trap 'echo got INT; exit 3' INT; echo ready; while :; do sleep 0.05; done")
	cmd.Env = append(os.Environ(), clientSocketVar+"="+path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 6)
	if _, err := out.Read(buf); err != nil || string(buf) != "ready\n" {
		t.Fatalf("reading ready: %q %v", buf, err)
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	var rest bytes.Buffer
	_, _ = rest.ReadFrom(out)
	_ = cmd.Wait()
	if rest.String() != "got INT\n" || cmd.ProcessState.ExitCode() != 3 {
		t.Errorf("after SIGINT: output %q, exit %d; want %q, 3", rest.String(), cmd.ProcessState.ExitCode(), "got INT\n")
	}
}
