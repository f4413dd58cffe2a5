package envd_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/kiln-sh/kiln/internal/e2b/envd/spec/process"
)

// maxMessage is the most of an error message a client may get back.
const maxMessage = 1100

// TestHostileInput sends envd what a hostile client would: each request
// is refused with invalid_argument or a 4xx and a short message, and
// none hangs. The native API's twin is server's TestHostileInput.
func TestHostileInput(t *testing.T) {
	e := newEnv(t, sandboxOpts())
	e.sh(t, "root", `mkfifo /tmp/fifo && printf '#!/bin/sh\necho ran\n' >/tmp/noexec.sh && chmod 644 /tmp/noexec.sh`)
	huge := strings.Repeat("x", 100<<10)
	t.Run("start", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			cfg  *process.ProcessConfig
			tag  string
			msg  string
		}{
			{"reserved env", &process.ProcessConfig{Cmd: "/bin/true", Envs: map[string]string{"KILN_X": "1"}}, "", "KILN_"},
			{"= in env name", &process.ProcessConfig{Cmd: "/bin/true", Envs: map[string]string{"A=B": "1"}}, "", "'='"},
			{"empty env name", &process.ProcessConfig{Cmd: "/bin/true", Envs: map[string]string{"": "1"}}, "", "1-256"},
			{"100 KB tag", bash("true"), huge, "tag"},
			{"non-executable file", &process.ProcessConfig{Cmd: "/tmp/noexec.sh"}, "", "not executable"},
			{"directory as program", &process.ProcessConfig{Cmd: "/tmp"}, "", "directory"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				s, err := e.process("", nil).Start(ctxTimeout(t, time.Minute), connect.NewRequest(&process.StartRequest{Process: tc.cfg, Tag: &tc.tag}))
				if err == nil {
					_, err = collect(s, nil)
				}
				wantCode(t, err, connect.CodeInvalidArgument)
				var ce *connect.Error
				if !errors.As(err, &ce) {
					t.Fatalf("%v is not a Connect error", err)
				}
				if msg := ce.Message(); !strings.Contains(msg, tc.msg) || len(msg) > maxMessage {
					t.Errorf("message %.300q, want one with %q", msg, tc.msg)
				}
			})
		}
	})
	t.Run("files", func(t *testing.T) {
		raw := map[string]string{"Content-Type": "application/octet-stream", "X-Access-Token": e.token}
		auth := map[string]string{"X-Access-Token": e.token}
		ctype, many := multipartBody(t, manyFiles(1001))
		for _, tc := range []struct {
			name, method, target string
			hdr                  map[string]string
			body                 *bytes.Buffer
			status               int // 0: any 4xx
			msg                  string
		}{
			{"FIFO without writer", "GET", "/files?path=/tmp/fifo&username=root", auth, nil, 400, "not a regular file"},
			{"device", "GET", "/files?path=/dev/zero&username=root", auth, nil, 400, "not a regular file"},
			{"/proc/self/mem", "GET", "/files?path=/proc/self/mem&username=root", auth, nil, 0, ""},
			{"/dev/tty", "GET", "/files?path=/dev/tty&username=root", auth, nil, 0, ""},
			{"/proc/sys write", "POST", "/files?path=/proc/sys/kernel/hostname&username=root", raw, bytes.NewBufferString("evil"), 0, ""},
			{"path ending in /", "POST", "/files?path=/tmp/newdir/&username=root", raw, bytes.NewBufferString("x"), 400, "ending in /"},
			{"1,001 files", "POST", "/files?username=root", map[string]string{"Content-Type": ctype, "X-Access-Token": e.token}, many, 400, "more than 1000 files"},
			{"100 KB user", "GET", "/files?path=/etc/hostname&username=" + huge, auth, nil, 401, "unknown user"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				var body *bytes.Buffer
				if tc.body != nil {
					body = tc.body
				} else {
					body = &bytes.Buffer{}
				}
				res, b := e.do(t, tc.method, tc.target, tc.hdr, body)
				switch {
				case tc.status == 0 && (res.StatusCode < 400 || res.StatusCode >= 500):
					t.Errorf("status %d %.300s, want 4xx", res.StatusCode, b)
				case tc.status != 0 && (res.StatusCode != tc.status || !bytes.Contains(b, []byte(tc.msg))):
					t.Errorf("%d %.300s, want %d with %q", res.StatusCode, b, tc.status, tc.msg)
				}
				if len(b) > maxMessage+64 {
					t.Errorf("answer of %d bytes: %.100s…", len(b), b)
				}
			})
		}
		res, b := e.do(t, "GET", "/files?path=/tmp/newdir&username=root", auth, &bytes.Buffer{})
		if res.StatusCode != http.StatusNotFound {
			t.Errorf("a refused write made /tmp/newdir: %d %s", res.StatusCode, b)
		}
	})
	t.Run("stdin that never drains", func(t *testing.T) { testStdinNeverDrains(t, e) })
}

// testStdinNeverDrains: input to a process that never reads it fails
// within a bound (each piece must be taken within 30 s, as the native
// API's stdin), even 8 calls at once; a message over the cap is refused
// before it is held (resource_exhausted), not buffered whole.
func testStdinNeverDrains(t *testing.T, e *env) {
	pc := e.process("", nil)
	s, err := pc.Start(ctxTimeout(t, 10*time.Minute), connect.NewRequest(&process.StartRequest{Process: bash("exec sleep 600"), Stdin: ptr(true)}))
	if err != nil || !s.Receive() {
		t.Fatal(err, s.Err())
	}
	pid := s.Msg().GetEvent().GetStart().GetPid()
	defer pc.SendSignal(context.Background(), connect.NewRequest(&process.SendSignalRequest{Process: pidSel(pid), Signal: process.Signal_SIGNAL_SIGKILL}))
	input := func(n int) *process.ProcessInput {
		return &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: bytes.Repeat([]byte("y"), n)}}
	}

	ctx := ctxTimeout(t, 5*time.Minute)
	_, err = pc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: pidSel(pid), Input: input(5 << 20)}))
	wantCode(t, err, connect.CodeResourceExhausted)

	const calls = 8
	errs := make(chan error, calls)
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() {
			if i == 0 { // one through the client stream
				cs := pc.StreamInput(ctx)
				_ = cs.Send(&process.StreamInputRequest{Event: &process.StreamInputRequest_Start{Start: &process.StreamInputRequest_StartEvent{Process: pidSel(pid)}}})
				_ = cs.Send(&process.StreamInputRequest{Event: &process.StreamInputRequest_Data{Data: &process.StreamInputRequest_DataEvent{Input: input(3 << 20)}}})
				_, err := cs.CloseAndReceive()
				errs <- err
				return
			}
			_, err := pc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: pidSel(pid), Input: input(3 << 20)}))
			errs <- err
		})
	}
	bound := time.After(3 * time.Minute)
	for range calls {
		select {
		case err := <-errs:
			if connect.CodeOf(err) != connect.CodeDeadlineExceeded {
				t.Errorf("input to a process that never reads: %v, want deadline_exceeded", err)
			}
		case <-bound:
			t.Fatal("input to a process that never reads still blocked after 3 minutes")
		}
	}
	wg.Wait()
	// The sandbox and the process are fine: it still takes input.
	if out := e.sh(t, "", "echo alive"); out != "alive\n" {
		t.Errorf("after the stalled input: %q", out)
	}
}

func manyFiles(n int) [][2]string {
	files := make([][2]string, n)
	for i := range files {
		files[i] = [2]string{fmt.Sprintf("/tmp/many/f%d", i), "x"}
	}
	return files
}
