package channel

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
)

// pipes returns the two ends of a full-duplex channel made of OS pipes, as
// between kiln serve and the agent.
type pipes struct {
	hostR, agentW *os.File // agent → host
	agentR, hostW *os.File // host → agent
}

func newPipes(t *testing.T) pipes {
	t.Helper()
	a, b, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	c, d, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	p := pipes{hostR: a, agentW: b, agentR: c, hostW: d}
	t.Cleanup(func() { a.Close(); b.Close(); c.Close(); d.Close() })
	return p
}

// testHandler implements a few methods for the tests.
func testHandler(ctx context.Context, st *Stream, method string, params json.RawMessage) (any, error) {
	switch method {
	case "echo":
		var s string
		_ = json.Unmarshal(params, &s)
		return s, nil
	case "digest": // the length and SHA-256 of a string
		var s string
		if err := json.Unmarshal(params, &s); err != nil {
			return nil, err
		}
		return fmt.Sprintf("%d %x", len(s), sha256.Sum256([]byte(s))), nil
	case "events":
		var n int
		_ = json.Unmarshal(params, &n)
		for i := range n {
			if err := st.SendEvent(ctx, i); err != nil {
				return nil, err
			}
		}
		return n, nil
	case "blob": // send n bytes of data
		var n int
		_ = json.Unmarshal(params, &n)
		b := bytes.Repeat([]byte{'x'}, n)
		return n, st.SendData(ctx, b)
	case "sink": // count received data until end
		total := 0
		for {
			f, err := st.Recv(ctx)
			if errors.Is(err, io.EOF) {
				return total, nil
			}
			if err != nil {
				return nil, err
			}
			total += len(f.Payload)
		}
	case "block":
		<-ctx.Done()
		return nil, ctx.Err()
	case "fail":
		return nil, &api.Error{Code: api.CodeNotFound, Message: "no such thing"}
	}
	return nil, &api.Error{Code: api.CodeInvalidArgument, Message: "unknown method " + method}
}

func serve(t *testing.T, p pipes) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go Serve(ctx, p.agentR, p.agentW, "test", testHandler)
}

// connect opens a host session on p without taking ownership of the pipes.
func connect(t *testing.T, p pipes) *Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Connect(ctx, io.NopCloser(p.hostR), nopWriteCloser{p.hostW})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

func TestCalls(t *testing.T) {
	p := newPipes(t)
	serve(t, p)
	c := connect(t, p)
	defer c.Close()
	ctx := context.Background()
	if got := c.Agent().Agent; got != "test" {
		t.Errorf("agent version = %q", got)
	}

	var s string
	if err := c.Invoke(ctx, "echo", "hi", &s); err != nil || s != "hi" {
		t.Fatalf("echo = %q, %v", s, err)
	}
	err := c.Invoke(ctx, "fail", nil, nil)
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != api.CodeNotFound {
		t.Fatalf("fail: got %v, want not_found", err)
	}

	// Many concurrent calls share the session.
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			st, err := c.Call(ctx, "events", 100)
			if err != nil {
				t.Error(err)
				return
			}
			defer st.Close()
			for want := range 100 {
				f, err := st.Recv(ctx)
				if err != nil {
					t.Errorf("call %d: event %d: %v", i, want, err)
					return
				}
				var got int
				if json.Unmarshal(f.Payload, &got); got != want {
					t.Errorf("call %d: got event %d, want %d", i, got, want)
				}
			}
			if _, err := st.Recv(ctx); !errors.Is(err, io.EOF) {
				t.Errorf("call %d: after events got %v, want EOF", i, err)
			}
		})
	}
	wg.Wait()
}

func TestFlowControlBothWays(t *testing.T) {
	p := newPipes(t)
	serve(t, p)
	c := connect(t, p)
	defer c.Close()
	ctx := context.Background()

	const n = 20 << 20
	st, err := c.Call(ctx, "blob", n)
	if err != nil {
		t.Fatal(err)
	}
	// A slow reader must not stall other streams: run a unary call while
	// the blob is unread.
	var s string
	if err := c.Invoke(ctx, "echo", "alive", &s); err != nil || s != "alive" {
		t.Fatalf("echo while a stream is stalled: %q %v", s, err)
	}
	got := 0
	for {
		f, err := st.Recv(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got += len(f.Payload)
	}
	st.Close()
	if got != n {
		t.Fatalf("received %d bytes, want %d", got, n)
	}

	up, err := c.Call(ctx, "sink", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	if err := up.SendData(ctx, make([]byte, n)); err != nil {
		t.Fatal(err)
	}
	if err := up.CloseSend(); err != nil {
		t.Fatal(err)
	}
	var total int
	if err := up.Wait(ctx, &total); err != nil || total != n {
		t.Fatalf("sink = %d, %v; want %d", total, err, n)
	}
}

func TestCancelReachesAgent(t *testing.T) {
	p := newPipes(t)
	serve(t, p)
	c := connect(t, p)
	defer c.Close()
	ctx := context.Background()
	st, err := c.Call(ctx, "block", nil)
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	// The agent ended the call; the session is still usable.
	var s string
	if err := c.Invoke(ctx, "echo", "after", &s); err != nil || s != "after" {
		t.Fatalf("echo = %q, %v", s, err)
	}
}

// A host that crashed mid-frame, and stale output of its session, must not
// confuse the next session on the same pipes.
func TestNewSessionResynchronises(t *testing.T) {
	p := newPipes(t)
	serve(t, p)
	ctx := context.Background()

	old := connect(t, p)
	st, err := old.Call(ctx, "blob", 8<<20) // leaves unread data in flight
	if err != nil {
		t.Fatal(err)
	}
	_ = st
	// Simulate a crash: the old host stops reading (its read loop ends on
	// the deadline) and leaves half a frame on the wire.
	p.hostR.SetReadDeadline(time.Now())
	<-old.Done()
	p.hostR.SetReadDeadline(time.Time{})
	half := appendFrame(nil, Frame{Type: frameCall, Stream: 99, Payload: bytes.Repeat([]byte("{"), 5000)})
	if _, err := p.hostW.Write(half[:len(half)/2]); err != nil {
		t.Fatal(err)
	}
	// Also garbage that contains the magic.
	p.hostW.Write([]byte("KLN1KLN1garbage"))

	c := connect(t, p)
	defer c.Close()
	var s string
	if err := c.Invoke(ctx, "echo", "fresh", &s); err != nil || s != "fresh" {
		t.Fatalf("echo on new session = %q, %v", s, err)
	}
}

func TestSessionEndsWhenAgentGoes(t *testing.T) {
	p := newPipes(t)
	ctx, cancel := context.WithCancel(context.Background())
	go Serve(ctx, p.agentR, p.agentW, "test", testHandler)
	c := connect(t, p)
	defer c.Close()
	st, err := c.Call(ctx, "block", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	cancel()
	p.agentW.Close() // the agent's stdout closes: the sandbox died
	if _, err := st.Recv(context.Background()); !errors.Is(err, ErrSessionClosed) {
		t.Fatalf("Recv after agent died = %v, want ErrSessionClosed", err)
	}
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done not closed")
	}
}

func TestFrameReaderSkipsGarbage(t *testing.T) {
	var b []byte
	b = append(b, "noise KLN"...)
	good := Frame{Type: FrameData, Stream: 7, Payload: []byte("payload")}
	corrupt := appendFrame(nil, Frame{Type: FrameData, Stream: 1, Payload: []byte("bad")})
	corrupt[len(corrupt)-1] ^= 0xff
	b = append(b, corrupt...)
	b = appendFrame(b, good)
	fr := newFrameReader(bytes.NewReader(b))
	f, err := fr.next()
	if err != nil {
		t.Fatal(err)
	}
	if f.Stream != 7 || string(f.Payload) != "payload" {
		t.Fatalf("got %+v", f)
	}
	if _, err := fr.next(); !errors.Is(err, io.EOF) {
		t.Fatalf("want EOF, got %v", err)
	}
}

func BenchmarkRoundTrip(b *testing.B) {
	p := newPipes(&testing.T{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go Serve(ctx, p.agentR, p.agentW, "bench", testHandler)
	c, err := Connect(ctx, io.NopCloser(p.hostR), nopWriteCloser{p.hostW})
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		var s string
		if err := c.Invoke(ctx, "echo", "x", &s); err != nil {
			b.Fatal(err)
		}
	}
}

// Events larger than one frame, and larger than the flow-control window,
// arrive whole.
func TestLargeEvents(t *testing.T) {
	p := newPipes(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sizes := []int{MaxPayload - 100, MaxPayload + 1, 3 * window, MaxEvent - 64}
	go Serve(ctx, p.agentR, p.agentW, "test", func(ctx context.Context, st *Stream, method string, params json.RawMessage) (any, error) {
		for _, n := range sizes {
			if err := st.SendEvent(ctx, strings.Repeat("x", n)); err != nil {
				return nil, err
			}
		}
		return nil, st.SendEvent(ctx, strings.Repeat("y", MaxEvent+1))
	})
	c := connect(t, p)
	defer c.Close()
	st, err := c.Call(ctx, "big", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, n := range sizes {
		f, err := st.Recv(ctx)
		if err != nil {
			t.Fatalf("event of %d: %v", n, err)
		}
		var s string
		if err := json.Unmarshal(f.Payload, &s); err != nil || len(s) != n {
			t.Fatalf("event of %d arrived as %d bytes: %v", n, len(s), err)
		}
	}
	if _, err := st.Recv(ctx); err == nil || !strings.Contains(err.Error(), "exceeds the limit") {
		t.Fatalf("oversized event: %v, want an error", err)
	}
}

// Calls larger than a frame travel in pieces, interleaved with other
// calls, up to MaxCall; a larger one is refused before anything is sent.
func TestLargeCalls(t *testing.T) {
	p := newPipes(t)
	serve(t, p)
	c := connect(t, p)
	defer c.Close()
	ctx := context.Background()
	if !c.Agent().LargeCalls {
		t.Fatal("agent does not say it takes large calls")
	}
	var wg sync.WaitGroup
	for _, n := range []int{MaxPayload - 100, MaxPayload + 1, 3*MaxPayload + 7, MaxCall - 64} {
		wg.Go(func() {
			in := strings.Repeat(string(rune('a'+n%26)), n)
			want := fmt.Sprintf("%d %x", len(in), sha256.Sum256([]byte(in)))
			var out string
			if err := c.Invoke(ctx, "digest", in, &out); err != nil || out != want {
				t.Errorf("call of %d bytes: agent got %q, want %q (%v)", n, out, want, err)
			}
		})
	}
	wg.Wait()
	if err := c.Invoke(ctx, "digest", strings.Repeat("z", MaxCall), nil); err == nil || !strings.Contains(err.Error(), "call limit") {
		t.Errorf("call over MaxCall: %v", err)
	}
	var s string
	if err := c.Invoke(ctx, "echo", "after", &s); err != nil || s != "after" {
		t.Errorf("session after large calls: %q %v", s, err)
	}

	// An agent from before large calls gets none.
	c.agent.LargeCalls = false
	if err := c.Invoke(ctx, "digest", strings.Repeat("z", MaxPayload), nil); err == nil || !strings.Contains(err.Error(), "older") {
		t.Errorf("large call to an older agent: %v", err)
	}
}
