package agent

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/channel"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
)

// harness runs a real Server in-process, with the host's end of the
// channel connected over a pair of pipes, as kiln serve would be.
type harness struct {
	t   testing.TB
	srv *Server
	// panics counts the methods that panicked (and were recovered).
	panics *atomic.Int64
	conn   *channel.Conn
	hr     *os.File // host reads the agent's stdout
	hw     *os.File // host writes the agent's stdin
}

func newHarness(t testing.TB, mutate ...func(*Config)) *harness {
	t.Helper()
	cfg, err := ConfigFromEnv(os.Environ())
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mutate {
		m(&cfg)
	}
	panics := new(atomic.Int64)
	log := slog.New(panicCounter{slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}), panics})
	srv := New(cfg, log)
	ar, hw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	hr, aw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(ctx, ar, aw)
	}()
	h := &harness{t: t, srv: srv, hr: hr, hw: hw, panics: panics}
	h.conn = h.connect()
	t.Cleanup(func() {
		closeCtx, c := context.WithTimeout(context.Background(), time.Second)
		defer c()
		_ = srv.Close(closeCtx)
		cancel()
		hw.Close()
		aw.Close()
		<-served
		hr.Close()
		ar.Close()
	})
	return h
}

// panicCounter counts the agent's log records of a recovered panic.
type panicCounter struct {
	slog.Handler
	n *atomic.Int64
}

func (p panicCounter) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == panicMessage {
		p.n.Add(1)
	}
	return p.Handler.Handle(ctx, r)
}

func (p panicCounter) WithAttrs(as []slog.Attr) slog.Handler {
	return panicCounter{p.Handler.WithAttrs(as), p.n}
}

func (p panicCounter) WithGroup(name string) slog.Handler {
	return panicCounter{p.Handler.WithGroup(name), p.n}
}

// connect starts a new host session on the same pipes; the previous
// session's reader is cut off first (as if its host process had died).
func (h *harness) connect() *channel.Conn {
	h.t.Helper()
	_ = h.hr.SetReadDeadline(time.Time{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := channel.Connect(ctx, &detachable{f: h.hr}, nopWriteCloser{h.hw})
	if err != nil {
		h.t.Fatalf("connecting: %v", err)
	}
	return conn
}

// drop abandons the current session without telling the agent, like a
// crashed host: its reader stops consuming the pipe.
func (h *harness) drop() {
	h.conn.Close()
	<-h.conn.Done()
}

// detachable reads a shared pipe until closed; Close interrupts a blocked
// read without closing the pipe, so that a later session can reuse it.
type detachable struct {
	f      *os.File
	closed atomic.Bool
}

func (d *detachable) Read(b []byte) (int, error) {
	if d.closed.Load() {
		return 0, io.EOF
	}
	n, err := d.f.Read(b)
	if d.closed.Load() {
		return n, io.EOF
	}
	return n, err
}

func (d *detachable) Close() error {
	d.closed.Store(true)
	return d.f.SetReadDeadline(time.Now())
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// result is what a process stream delivered.
type result struct {
	events []api.Event
	status api.ExitStatus
	err    error
}

func (r result) output(typ api.EventType) string {
	var b strings.Builder
	for _, ev := range r.events {
		if ev.Type == typ {
			b.Write(ev.Data)
		}
	}
	return b.String()
}

// collect receives a process stream's events until its end.
func collect(ctx context.Context, st *channel.Stream) result {
	var r result
	for {
		f, err := st.Recv(ctx)
		if errors.Is(err, io.EOF) {
			r.err = st.Wait(ctx, &r.status)
			return r
		}
		if err != nil {
			r.err = err
			return r
		}
		var ev api.Event
		if err := json.Unmarshal(f.Payload, &ev); err != nil {
			r.err = err
			return r
		}
		r.events = append(r.events, ev)
	}
}

// exec runs a process to completion.
func (h *harness) exec(p wire.ExecParams) result {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := h.conn.Call(ctx, wire.MethodExec, p)
	if err != nil {
		h.t.Fatalf("calling exec: %v", err)
	}
	defer st.Close()
	return collect(ctx, st)
}

// nextEvent receives one event from a stream.
func nextEvent(t *testing.T, ctx context.Context, st *channel.Stream) api.Event {
	t.Helper()
	f, err := st.Recv(ctx)
	if err != nil {
		t.Fatalf("receiving event: %v", err)
	}
	var ev api.Event
	if err := json.Unmarshal(f.Payload, &ev); err != nil {
		t.Fatalf("decoding event: %v", err)
	}
	return ev
}

func errCode(err error) api.ErrorCode {
	var e *api.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (switches users / mounts)")
	}
}

// userDir returns a temporary directory that uid 1000 may use.
func userDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}
