package channel

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/kiln-sh/kiln/api"
)

// ProtocolVersion is bumped on any incompatible change of the channel or of
// the agent's methods. Host and agent must agree exactly.
const ProtocolVersion = 1

// Hello opens a session (host→agent) and acknowledges it (agent→host).
type Hello struct {
	Session  string `json:"session"`
	Protocol int    `json:"protocol"`
	Agent    string `json:"agent,omitempty"` // the agent's build version
	// LargeCalls: the agent reassembles calls sent in pieces (see
	// MaxCall). Agents from before it (in older checkpoints) omit it.
	LargeCalls bool `json:"large_calls,omitempty"`
}

// MaxCall bounds a call: its method and encoded params. A call larger
// than MaxPayload travels in pieces (call frames flagged more, the last
// one not), which the agent reassembles before it runs the call.
const MaxCall = 16 << 20

// maxPendingCalls bounds the calls an agent reassembles at once.
const maxPendingCalls = 64

type call struct {
	Method string          `json:"method"`
	Params json.RawMessage `json:"params,omitempty"`
}

// session is the state shared by both ends: the writer and the streams.
type session struct {
	w    io.Writer
	wmu  sync.Mutex
	wbuf []byte

	gen  atomic.Uint64 // agent side: bumped by every Hello
	dead atomic.Bool

	mu      sync.Mutex
	streams map[uint32]*Stream
}

func (s *session) closed() bool { return s.dead.Load() }

// write sends f unless st belongs to an older session generation.
func (s *session) write(st *Stream, f Frame) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.dead.Load() || (st != nil && st.gen != s.gen.Load()) {
		return ErrSessionClosed
	}
	s.wbuf = appendFrame(s.wbuf[:0], f)
	if _, err := s.w.Write(s.wbuf); err != nil {
		return fmt.Errorf("writing %s frame: %w", f.Type, err)
	}
	if cap(s.wbuf) > 2*(headerSize+MaxPayload) {
		s.wbuf = nil
	}
	return nil
}

func (s *session) lookup(id uint32) *Stream {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.streams[id]
}

func (s *session) remove(st *Stream) {
	s.mu.Lock()
	if s.streams[st.id] == st {
		delete(s.streams, st.id)
	}
	s.mu.Unlock()
	st.cancel()
}

// cancelAll ends every stream, e.g. when a new host session begins.
func (s *session) cancelAll() {
	s.mu.Lock()
	old := s.streams
	s.streams = make(map[uint32]*Stream)
	s.mu.Unlock()
	for _, st := range old {
		st.cancel()
	}
}

// Conn is the host's end of a session with an agent.
type Conn struct {
	s      *session
	r      io.Closer
	w      io.Closer
	agent  Hello
	nextID atomic.Uint32
	done   chan struct{}
	err    error
}

// Connect starts a new session over the agent's pipes: it pads away any
// half-written frame a previous session left, sends Hello and discards
// everything until the matching acknowledgement. Close closes r and w.
func Connect(ctx context.Context, r io.ReadCloser, w io.WriteCloser) (*Conn, error) {
	return dial(ctx, r, w, true)
}

// ConnectFresh is Connect for pipes no session has used yet (a sandbox
// that just started): there is nothing to resynchronise, so it skips the
// padding.
func ConnectFresh(ctx context.Context, r io.ReadCloser, w io.WriteCloser) (*Conn, error) {
	return dial(ctx, r, w, false)
}

func dial(ctx context.Context, r io.ReadCloser, w io.WriteCloser, pad bool) (*Conn, error) {
	c := &Conn{s: &session{w: w, streams: make(map[uint32]*Stream)}, r: r, w: w, done: make(chan struct{})}
	id := make([]byte, 8)
	_, _ = rand.Read(id)
	hello := Hello{Session: hex.EncodeToString(id), Protocol: ProtocolVersion}

	acked := make(chan error, 1)
	go c.readLoop(newFrameReader(r), hello.Session, acked)

	b, _ := json.Marshal(hello)
	sent := make(chan error, 1)
	go func() {
		if pad {
			if _, err := w.Write(make([]byte, padSize)); err != nil {
				sent <- fmt.Errorf("writing resync padding: %w", err)
				return
			}
		}
		sent <- c.s.write(nil, Frame{Type: frameHello, Payload: b})
	}()
	var err error
	select {
	case err = <-sent:
		if err == nil {
			select {
			case err = <-acked:
			case <-ctx.Done():
				err = ctx.Err()
			}
		}
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("connecting to agent: %w", err)
	}
	return c, nil
}

func (c *Conn) readLoop(fr *frameReader, session string, acked chan<- error) {
	defer close(c.done)
	var err error
	defer func() {
		c.err = err
		c.s.dead.Store(true)
		c.s.cancelAll()
		if acked != nil {
			acked <- fmt.Errorf("agent closed the channel before the handshake: %w", err)
		}
	}()
	for {
		var f Frame
		f, err = fr.next()
		if err != nil {
			return
		}
		if acked != nil {
			if f.Type != frameHelloAck {
				continue
			}
			var h Hello
			if json.Unmarshal(f.Payload, &h) != nil || h.Session != session {
				continue // a stale acknowledgement of an earlier session
			}
			c.agent = h
			if h.Protocol != ProtocolVersion {
				acked <- fmt.Errorf("agent %s speaks protocol %d, want %d", h.Agent, h.Protocol, ProtocolVersion)
			} else {
				acked <- nil
			}
			acked = nil
			continue
		}
		st := c.s.lookup(f.Stream)
		if st == nil {
			continue
		}
		if !st.deliver(f) {
			// The agent overran its window: drop the stream.
			_ = c.s.write(nil, Frame{Type: frameCancel, Stream: st.id, Payload: []byte{}})
			c.s.remove(st)
		}
	}
}

// Agent returns the agent's hello: its build version.
func (c *Conn) Agent() Hello { return c.agent }

// Done is closed when the session ends; Err then says why.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err returns why the session ended, once Done is closed.
func (c *Conn) Err() error {
	select {
	case <-c.done:
		return c.err
	default:
		return nil
	}
}

// Close ends the session and closes the pipes.
func (c *Conn) Close() error {
	c.s.dead.Store(true)
	err := errors.Join(c.w.Close(), c.r.Close())
	c.s.cancelAll()
	return err
}

// Call opens a stream that runs method with params in the agent. The
// caller must Close the stream.
func (c *Conn) Call(ctx context.Context, method string, params any) (*Stream, error) {
	p, err := json.Marshal(params)
	if err != nil {
		return nil, fmt.Errorf("encoding %s params: %w", method, err)
	}
	b, err := json.Marshal(call{Method: method, Params: p})
	if err != nil {
		return nil, err
	}
	switch {
	case len(b) > MaxCall:
		return nil, fmt.Errorf("%s call of %d bytes exceeds the call limit of %d bytes", method, len(b), MaxCall)
	case len(b) > MaxPayload && !c.agent.LargeCalls:
		return nil, fmt.Errorf("%s call of %d bytes exceeds the frame limit of %d bytes of this (older) agent", method, len(b), MaxPayload)
	}
	st := newStream(c.s, c.nextID.Add(1), context.Background())
	st.finalEnd = true
	c.s.mu.Lock()
	c.s.streams[st.id] = st
	c.s.mu.Unlock()
	if c.s.closed() {
		c.s.remove(st)
		return nil, ErrSessionClosed
	}
	for {
		n := min(len(b), MaxPayload)
		if err := c.s.write(nil, Frame{Type: frameCall, Stream: st.id, Payload: b[:n], more: n < len(b)}); err != nil {
			c.s.remove(st)
			return nil, err
		}
		if b = b[n:]; len(b) == 0 {
			return st, nil
		}
	}
}

// Invoke runs a unary method: it ignores any events and decodes the result
// into result (which may be nil).
func (c *Conn) Invoke(ctx context.Context, method string, params, result any) error {
	st, err := c.Call(ctx, method, params)
	if err != nil {
		return err
	}
	defer st.Close()
	return st.Wait(ctx, result)
}

// Wait discards the remaining frames until the peer's end, and decodes its
// result into result (which may be nil).
func (st *Stream) Wait(ctx context.Context, result any) error {
	for {
		_, err := st.Recv(ctx)
		if err == nil {
			continue
		}
		if !errors.Is(err, io.EOF) {
			return err
		}
		st.mu.Lock()
		r := st.endMsg.Result
		st.mu.Unlock()
		if result != nil && len(r) > 0 {
			if err := json.Unmarshal(r, result); err != nil {
				return fmt.Errorf("decoding result: %w", err)
			}
		}
		return nil
	}
}

// CloseSend tells the agent no more data follows (e.g. the end of an upload).
func (st *Stream) CloseSend() error {
	return st.sess.write(nil, Frame{Type: frameEnd, Stream: st.id, Payload: []byte("{}")})
}

// Close releases the stream; if the agent has not finished, it is told to
// cancel the call.
func (st *Stream) Close() {
	st.mu.Lock()
	ended := st.ended
	st.mu.Unlock()
	if !ended && st.ctx.Err() == nil {
		_ = st.sess.write(nil, Frame{Type: frameCancel, Stream: st.id, Payload: []byte{}})
	}
	st.sess.remove(st)
}

// HandlerFunc serves one call in the agent. It streams events and data on
// st and returns the call's result. Its ctx is cancelled when the host
// cancels the call or a new host session begins.
type HandlerFunc func(ctx context.Context, st *Stream, method string, params json.RawMessage) (any, error)

// Serve is the agent's end: it answers every Hello with an acknowledgement
// (ending the previous session's streams) and runs each call in its own
// goroutine. It returns when r fails or ctx is done.
func Serve(ctx context.Context, r io.Reader, w io.Writer, agentVersion string, h HandlerFunc) error {
	s := &session{w: w, streams: make(map[uint32]*Stream)}
	fr := newFrameReader(r)
	active := false
	pending := map[uint32][]byte{} // calls being reassembled, by stream
	errc := make(chan error, 1)
	go func() {
		for {
			f, err := fr.next()
			if err != nil {
				errc <- err
				return
			}
			switch f.Type {
			case frameHello:
				var hello Hello
				if json.Unmarshal(f.Payload, &hello) != nil {
					continue
				}
				s.gen.Add(1)
				s.cancelAll()
				active = true
				clear(pending)
				b, _ := json.Marshal(Hello{Session: hello.Session, Protocol: ProtocolVersion, Agent: agentVersion, LargeCalls: true})
				go s.write(nil, Frame{Type: frameHelloAck, Payload: b})
			case frameCall:
				if !active || s.lookup(f.Stream) != nil {
					continue
				}
				payload := f.Payload
				if buf, ok := pending[f.Stream]; ok || f.more {
					if !ok && len(pending) >= maxPendingCalls {
						continue
					}
					buf = append(buf, f.Payload...)
					if len(buf) > MaxCall {
						delete(pending, f.Stream)
						continue
					}
					if f.more {
						pending[f.Stream] = buf
						continue
					}
					delete(pending, f.Stream)
					payload = buf
				}
				var c call
				if json.Unmarshal(payload, &c) != nil {
					continue
				}
				st := newStream(s, f.Stream, ctx)
				st.gen = s.gen.Load()
				s.mu.Lock()
				s.streams[st.id] = st
				s.mu.Unlock()
				go func() {
					defer s.remove(st)
					res, err := h(st.ctx, st, c.Method, c.Params)
					_ = st.sendEnd(res, toAPIError(err))
				}()
			case frameCancel:
				if st := s.lookup(f.Stream); st != nil {
					st.cancel()
				}
			default:
				if st := s.lookup(f.Stream); st != nil && !st.deliver(f) {
					st.cancel()
				}
			}
		}
	}()
	select {
	case err := <-errc:
		s.dead.Store(true)
		s.cancelAll()
		return err
	case <-ctx.Done():
		s.dead.Store(true)
		s.cancelAll()
		return ctx.Err()
	}
}

func toAPIError(err error) *api.Error {
	if err == nil {
		return nil
	}
	var e *api.Error
	if errors.As(err, &e) {
		return e
	}
	if errors.Is(err, context.Canceled) {
		return &api.Error{Code: api.CodeUnavailable, Message: "call cancelled"}
	}
	return &api.Error{Code: api.CodeInternal, Message: err.Error()}
}
