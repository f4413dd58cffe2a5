package channel

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/kiln-sh/kiln/api"
)

const (
	// window is how many payload bytes one side may have in flight on one
	// stream before the receiver grants more. It bounds the receiver's
	// memory per stream.
	window = 1 << 20
	// frameCost is added to every frame's payload size when accounting, so
	// that floods of empty frames are bounded too.
	frameCost = 64
)

// ErrSessionClosed is returned on streams whose session ended: the
// connection broke or another host session replaced it.
var ErrSessionClosed = errors.New("channel session closed")

// ErrStreamEnded is returned when sending on a host stream whose call the
// agent has already finished successfully.
var ErrStreamEnded = errors.New("channel stream ended by the peer")

// end is the payload of an end frame.
type end struct {
	Result json.RawMessage `json:"result,omitempty"`
	Error  *api.Error      `json:"error,omitempty"`
}

// Stream is one bidirectional, flow-controlled stream of a session.
type Stream struct {
	id   uint32
	gen  uint64 // the agent session generation that opened it
	sess *session

	ctx    context.Context // done when the stream is cancelled or the session ends
	cancel context.CancelFunc

	mu       sync.Mutex
	queue    []Frame
	queued   int        // cost of queued frames
	consumed int        // cost consumed and not yet credited back
	partial  []byte     // an event arriving in pieces
	sendMu   sync.Mutex // keeps the pieces of one event together
	credit   int        // bytes we may still send
	ended    bool
	endMsg   end
	// finalEnd: the peer's end finishes the call, not just its half (the
	// host's streams: the agent's end means its handler returned and no
	// more credit will come), so sending after it fails at once.
	finalEnd bool
	readable chan struct{} // 1-buffered: queue grew or the peer ended
	writable chan struct{} // 1-buffered: credit arrived
}

func newStream(s *session, id uint32, parent context.Context) *Stream {
	ctx, cancel := context.WithCancel(parent)
	return &Stream{id: id, sess: s, ctx: ctx, cancel: cancel, credit: window,
		readable: make(chan struct{}, 1), writable: make(chan struct{}, 1)}
}

func cost(f Frame) int { return len(f.Payload) + frameCost }

func wake(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// deliver queues an incoming frame; it never blocks. It reports false if
// the peer overran its window (a protocol violation).
func (st *Stream) deliver(f Frame) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	switch f.Type {
	case frameCredit:
		if len(f.Payload) == 4 {
			st.credit += int(binary.BigEndian.Uint32(f.Payload))
			wake(st.writable)
		}
		return true
	case frameEnd:
		st.ended = true
		if err := json.Unmarshal(f.Payload, &st.endMsg); err != nil {
			st.endMsg = end{Error: &api.Error{Code: api.CodeInternal, Message: "malformed end frame"}}
		}
		wake(st.writable)
	case FrameEvent, FrameData:
		if st.ended {
			return true
		}
		f.cost = cost(f)
		if f.more || st.partial != nil {
			if f.Type != FrameEvent || len(st.partial)+len(f.Payload) > MaxEvent {
				return false
			}
			st.partial = append(st.partial, f.Payload...)
			if f.more {
				// Pieces are held here, not queued: credit them now so
				// that an event larger than the window can complete.
				// Asynchronously: deliver runs on the read loop, which
				// must never block on the peer.
				go st.sess.write(st, Frame{Type: frameCredit, Stream: st.id, Payload: binary.BigEndian.AppendUint32(nil, uint32(f.cost))})
				return true
			}
			f.Payload, st.partial = st.partial, nil
		}
		if st.queued+f.cost > window+MaxPayload+frameCost {
			return false
		}
		st.queue = append(st.queue, f)
		st.queued += f.cost
	default:
		// Hellos, calls and cancels are the session's business; anything
		// else on a stream is a peer breaking the protocol.
		return false
	}
	wake(st.readable)
	return true
}

// Recv returns the next event or data frame. After the peer's end frame it
// returns io.EOF, or the peer's error.
func (st *Stream) Recv(ctx context.Context) (Frame, error) {
	for {
		st.mu.Lock()
		if len(st.queue) > 0 {
			f := st.queue[0]
			st.queue[0] = Frame{}
			st.queue = st.queue[1:]
			st.queued -= f.cost
			st.consumed += f.cost
			grant := 0
			if st.consumed >= window/4 {
				grant, st.consumed = st.consumed, 0
			}
			st.mu.Unlock()
			if grant > 0 {
				// A lost credit only slows the peer; the stream's end
				// or the session's end will surface elsewhere.
				_ = st.sess.write(st, Frame{Type: frameCredit, Stream: st.id, Payload: binary.BigEndian.AppendUint32(nil, uint32(grant))})
			}
			return f, nil
		}
		if st.ended {
			err := endError(st.endMsg)
			st.mu.Unlock()
			return Frame{}, err
		}
		st.mu.Unlock()
		select {
		case <-st.readable:
		case <-ctx.Done():
			return Frame{}, ctx.Err()
		case <-st.ctx.Done():
			return Frame{}, st.doneErr()
		}
	}
}

func endError(e end) error {
	if e.Error != nil {
		return e.Error
	}
	return io.EOF
}

// doneErr explains why the stream's context ended.
func (st *Stream) doneErr() error {
	if st.sess.closed() {
		return ErrSessionClosed
	}
	return context.Canceled
}

// Context is done when the stream is cancelled by the peer or the session ends.
func (st *Stream) Context() context.Context { return st.ctx }

// SendEvent sends v as a JSON event frame.
func (st *Stream) SendEvent(ctx context.Context, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encoding event: %w", err)
	}
	if len(b) > MaxEvent {
		return fmt.Errorf("event of %d bytes exceeds the limit of %d", len(b), MaxEvent)
	}
	st.sendMu.Lock()
	defer st.sendMu.Unlock()
	if len(b) > MaxPayload {
		for len(b) > MaxPayload {
			if err := st.send(ctx, Frame{Type: FrameEvent, Stream: st.id, Payload: b[:MaxPayload], more: true}); err != nil {
				return err
			}
			b = b[MaxPayload:]
		}
	}
	return st.send(ctx, Frame{Type: FrameEvent, Stream: st.id, Payload: b})
}

// SendData sends b as raw data frames, split as needed.
func (st *Stream) SendData(ctx context.Context, b []byte) error {
	st.sendMu.Lock()
	defer st.sendMu.Unlock()
	for len(b) > 0 {
		n := min(len(b), MaxPayload)
		if err := st.send(ctx, Frame{Type: FrameData, Stream: st.id, Payload: b[:n]}); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// send waits for window credit, then writes f.
func (st *Stream) send(ctx context.Context, f Frame) error {
	c := cost(f)
	for {
		st.mu.Lock()
		if st.finalEnd && st.ended {
			err := endError(st.endMsg)
			st.mu.Unlock()
			if errors.Is(err, io.EOF) {
				err = ErrStreamEnded
			}
			return err
		}
		if st.credit >= c {
			st.credit -= c
			st.mu.Unlock()
			return st.sess.write(st, f)
		}
		st.mu.Unlock()
		select {
		case <-st.writable:
		case <-ctx.Done():
			return ctx.Err()
		case <-st.ctx.Done():
			return st.doneErr()
		}
	}
}

// sendEnd closes our half of the stream with a result or an error.
func (st *Stream) sendEnd(result any, e *api.Error) error {
	m := end{Error: e}
	if result != nil && e == nil {
		b, err := json.Marshal(result)
		if err != nil {
			m.Error = &api.Error{Code: api.CodeInternal, Message: "encoding result: " + err.Error()}
		} else {
			m.Result = b
		}
	}
	b, _ := json.Marshal(m)
	if len(b) > MaxPayload {
		// The peer would discard an oversized frame and wait forever.
		b, _ = json.Marshal(end{Error: &api.Error{Code: api.CodeResourceExhausted,
			Message: fmt.Sprintf("result of %d bytes exceeds the frame limit", len(b))}})
	}
	return st.sess.write(st, Frame{Type: frameEnd, Stream: st.id, Payload: b})
}
