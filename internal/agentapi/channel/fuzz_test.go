package channel

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The fuzz targets run their seeds as unit tests; `make fuzz` (part of
// `make test`) explores each for a bounded time. Both ends of the channel
// read bytes the other side controls: the agent reads what a (possibly
// crashed, half-written) host sent, and the host reads what a hostile
// sandbox writes. Neither may panic, hang or hold more than its bounds.

// FuzzFrameReader feeds arbitrary bytes to the frame decoder: every frame
// it returns must be within bounds and literally present in the input (a
// decoder never invents frames), and a valid frame after the garbage is
// always found.
func FuzzFrameReader(f *testing.F) {
	for _, s := range [][]byte{
		nil, []byte("KLN1"), []byte("KLN1KLN1KLN1"),
		appendFrame(nil, Frame{Type: FrameEvent, Stream: 1, Payload: []byte(`{"a":1}`)}),
		appendFrame([]byte("garbageKLN"), Frame{Type: FrameData, Stream: 9, Payload: []byte("x"), more: true}),
		append(appendFrame(nil, Frame{Type: frameEnd, Payload: []byte("{}")})[:10], "KLN1"...),
	} {
		f.Add(s)
	}
	sentinel := Frame{Type: FrameData, Stream: 0xfeedbeef, Payload: []byte("sentinel")}
	f.Fuzz(func(t *testing.T, data []byte) {
		fr := newFrameReader(bytes.NewReader(data))
		for {
			fr2, err := fr.next()
			if err != nil {
				break
			}
			if len(fr2.Payload) > MaxPayload {
				t.Fatalf("frame payload of %d bytes", len(fr2.Payload))
			}
			if !bytes.Contains(data, appendFrame(nil, fr2)) {
				t.Fatalf("decoded a frame not present in the input: %+v", fr2)
			}
		}
		// Resynchronisation: after a writer's padding, whatever came
		// before, the next frame is found intact.
		in := append(bytes.Clone(data), make([]byte, padSize)...)
		in = appendFrame(in, sentinel)
		fr = newFrameReader(bytes.NewReader(in))
		for {
			got, err := fr.next()
			if err != nil {
				t.Fatalf("sentinel frame after padding not found: %v", err)
			}
			if got.Stream == sentinel.Stream && string(got.Payload) == "sentinel" {
				break
			}
		}
	})
}

// framesFrom turns fuzz bytes into a byte stream of well-formed frames (so
// the fuzzer explores the protocol, not the CRC), with raw bytes mixed in:
// each record is type, flags, stream, length, payload.
func framesFrom(data []byte) []byte {
	var out []byte
	for len(data) >= 4 {
		typ, flags, stream, n := data[0], data[1], data[2], int(data[3])
		data = data[4:]
		n = min(n, len(data))
		payload := data[:n]
		data = data[n:]
		if flags&0x80 != 0 { // raw garbage instead of a frame
			out = append(out, payload...)
			continue
		}
		out = appendFrame(out, Frame{Type: FrameType(typ % 10), Stream: uint32(stream % 4), Payload: payload, more: flags&1 != 0})
	}
	return out
}

// record is one framesFrom record, to build seeds.
func record(typ FrameType, stream uint32, payload string, more bool) []byte {
	flags := byte(0)
	if more {
		flags = 1
	}
	return append([]byte{byte(typ), flags, byte(stream), byte(len(payload))}, payload...)
}

func callPayload(method string, params any) string {
	p, _ := json.Marshal(params)
	b, _ := json.Marshal(call{Method: method, Params: p})
	return string(b)
}

// FuzzAgentInput is the agent's side: a session opened by a Hello, then
// arbitrary frames (calls, data, ends, cancels, credits, a new Hello).
// Serve must survive all of it and return when its input ends.
func FuzzAgentInput(f *testing.F) {
	hello, _ := json.Marshal(Hello{Session: "s", Protocol: ProtocolVersion})
	f.Add(bytes.Join([][]byte{
		record(frameCall, 1, callPayload("echo", "hi"), false),
		record(frameCall, 2, callPayload("sink", nil), false),
		record(FrameData, 2, "abc", false),
		record(frameEnd, 2, "{}", false),
		record(frameCall, 3, callPayload("events", 3), false),
		record(frameCredit, 3, "\x00\x00\x10\x00", false),
		record(frameCancel, 3, "", false),
	}, nil))
	f.Add(bytes.Join([][]byte{
		record(frameCall, 1, callPayload("sink", nil), false),
		record(FrameEvent, 1, `{"a":`, true),
		record(FrameEvent, 1, `1}`, false),
		record(frameHello, 0, string(hello), false),
		record(frameCall, 1, callPayload("block", nil), false),
		record(frameCall, 1, `not json`, false),
	}, nil))
	f.Add(record(frameCall, 0, `{"method":"echo","params":`, false))
	call := callPayload("digest", "a call in pieces")
	f.Add(bytes.Join([][]byte{ // calls in pieces, interleaved, one never finished
		record(frameCall, 4, call[:10], true),
		record(frameCall, 5, call[:3], true),
		record(frameCall, 4, call[10:], false),
		record(frameCall, 5, call[3:], true),
		record(frameHello, 0, string(hello), false),
		record(frameCall, 5, call, false),
	}, nil))
	f.Fuzz(func(t *testing.T, data []byte) {
		in := appendFrame(nil, Frame{Type: frameHello, Payload: hello})
		in = append(in, framesFrom(data)...)
		ctx, cancel := context.WithCancel(context.Background())
		var running atomic.Int64
		handler := func(hctx context.Context, st *Stream, method string, params json.RawMessage) (any, error) {
			running.Add(1)
			defer running.Add(-1)
			return testHandler(hctx, st, method, params)
		}
		done := make(chan error, 1)
		go func() { done <- Serve(ctx, bytes.NewReader(in), io.Discard, "fuzz", handler) }()
		select {
		case err := <-done:
			if !errors.Is(err, io.EOF) {
				t.Fatalf("Serve returned %v at the end of its input, want EOF", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Serve did not return at the end of its input")
		}
		cancel()
		// Every handler ends once the session is gone.
		for deadline := time.Now().Add(10 * time.Second); running.Load() > 0; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d handlers still running after the session ended", running.Load())
			}
		}
	})
}

// FuzzHostInput is the host's side, reading what a hostile agent writes:
// after a genuine handshake, arbitrary frames on the host's open streams.
// The host must neither panic nor deliver more than the window and the
// event size allow, and every stream must end when the agent's output ends.
func FuzzHostInput(f *testing.F) {
	f.Add(bytes.Join([][]byte{
		record(FrameEvent, 1, `{"type":"stdout"}`, false),
		record(FrameData, 2, "data", false),
		record(frameCredit, 2, "\xff\xff\xff\xff", false),
		record(frameEnd, 1, `{"result":1}`, false),
		record(frameEnd, 2, `{"error":{"code":"not_found","message":"x"}}`, false),
		record(FrameData, 1, "after end", false),
	}, nil))
	f.Add(bytes.Join([][]byte{
		record(FrameEvent, 3, "piece", true),
		record(FrameData, 3, "not an event", false),
		record(frameHelloAck, 0, `{"session":"other"}`, false),
		record(frameEnd, 3, `garbage`, false),
	}, nil))
	f.Fuzz(func(t *testing.T, data []byte) {
		hr, aw := io.Pipe() // agent → host
		ar, hw := io.Pipe() // host → agent
		defer ar.Close()
		defer hr.Close()
		go func() {
			// The fake agent: acknowledge the Hello, then write the
			// fuzzed frames and hang up, draining the host's writes.
			fr := newFrameReader(ar)
			f, err := fr.next()
			if err != nil {
				aw.CloseWithError(err)
				return
			}
			var h Hello
			json.Unmarshal(f.Payload, &h)
			ack, _ := json.Marshal(Hello{Session: h.Session, Protocol: ProtocolVersion})
			go io.Copy(io.Discard, ar)
			aw.Write(appendFrame(nil, Frame{Type: frameHelloAck, Payload: ack}))
			time.Sleep(time.Millisecond) // let the host open its calls
			aw.Write(framesFrom(data))
			aw.Close()
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := ConnectFresh(ctx, hr, hw)
		if err != nil {
			return // the fake agent's input may end before the ack is read
		}
		defer c.Close()
		var wg sync.WaitGroup
		for range 3 {
			st, err := c.Call(ctx, "m", nil)
			if err != nil {
				break
			}
			wg.Go(func() {
				defer st.Close()
				for {
					fr, err := st.Recv(ctx)
					if err != nil {
						if ctx.Err() != nil {
							t.Errorf("stream %d did not end when the agent hung up", st.id)
						}
						return
					}
					if fr.Type == FrameEvent && len(fr.Payload) > MaxEvent {
						t.Errorf("event of %d bytes delivered", len(fr.Payload))
					}
					if fr.Type != FrameEvent && fr.Type != FrameData {
						t.Errorf("Recv returned a %s frame", fr.Type)
					}
				}
			})
		}
		wg.Wait()
		select {
		case <-c.Done():
		case <-ctx.Done():
			t.Fatal("session did not end when the agent hung up")
		}
	})
}
