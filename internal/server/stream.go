package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/edge"
	"github.com/kiln-sh/kiln/internal/errdefs"
)

// writeTimeout bounds one write to a stream's client; a client that reads
// nothing for this long is dropped (its command keeps running).
const writeTimeout = 30 * time.Second

// errClientGone ends a producer whose client went away.
var errClientGone = errors.New("stream client went away")

// stream sends api.Events (or build log entries) to one client: one JSON text message each over a
// WebSocket if the request asked for an upgrade, else NDJSON flushed per
// event. It opens on the first event, so an error before it (unknown pid,
// bad path) is still answered with a status. It sends a ping event after
// each s.ping of silence. Its ctx ends when the client goes away or the
// server's drain period is over; producers must follow it.
type stream struct {
	srv    *Server
	w      http.ResponseWriter
	r      *http.Request
	ctx    context.Context
	cancel context.CancelFunc
	stop   func() bool // detaches from the server's drain

	mu   sync.Mutex
	open bool
	ws   *websocket.Conn
	last time.Time
	gone bool // a write failed: the client is gone

	done chan struct{}
}

// isWebSocket reports whether r asks for a WebSocket upgrade.
func isWebSocket(r *http.Request) bool {
	return strings.EqualFold(r.Header.Get("Upgrade"), "websocket")
}

func (s *Server) newStream(w http.ResponseWriter, r *http.Request) *stream {
	ctx, cancel := context.WithCancel(r.Context())
	s.streams.Add(1)
	return &stream{
		srv: s, w: w, r: r, ctx: ctx, cancel: cancel,
		stop: context.AfterFunc(s.drain, cancel),
		done: make(chan struct{}),
	}
}

// send writes ev; it is the emit callback of Agent.Exec, Attach and Watch.
func (st *stream) send(ev api.Event) error { return st.sendValue(ev) }

// sendValue writes one JSON value: an event, or an entry of a stream of
// another kind (a build's log), which shares the ping and error events.
func (st *stream) sendValue(v any) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if !st.open {
		if err := st.openLocked(); err != nil {
			return err
		}
	}
	return st.writeLocked(v)
}

func (st *stream) openLocked() error {
	st.open = true
	st.last = time.Now()
	if isWebSocket(st.r) {
		c, err := websocket.Accept(st.w, st.r, &websocket.AcceptOptions{CompressionMode: websocket.CompressionDisabled})
		if err != nil {
			st.gone = true
			return fmt.Errorf("upgrading to websocket: %w: %w", errClientGone, err)
		}
		edge.Hijacked(st.w)
		st.ws = c
		// Reading only handles control frames and notices the client
		// closing; it must outlive ctx so that Close can shake hands.
		readCtx := c.CloseRead(context.WithoutCancel(st.ctx))
		context.AfterFunc(readCtx, st.cancel)
	} else {
		h := st.w.Header()
		h.Set("Content-Type", "application/x-ndjson")
		h.Set("Cache-Control", "no-store")
		h.Set("X-Accel-Buffering", "no")
		st.w.WriteHeader(http.StatusOK)
	}
	go st.pinger()
	return nil
}

func (st *stream) writeLocked(v any) error {
	if st.gone {
		return errClientGone
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encoding event: %w", err)
	}
	st.last = time.Now()
	if st.ws != nil {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(st.ctx), writeTimeout)
		defer cancel()
		err = st.ws.Write(ctx, websocket.MessageText, b)
	} else {
		rc := http.NewResponseController(st.w)
		_ = rc.SetWriteDeadline(time.Now().Add(writeTimeout))
		if _, err = st.w.Write(append(b, '\n')); err == nil {
			err = rc.Flush()
		}
	}
	if err != nil {
		st.gone = true
		st.cancel()
		return fmt.Errorf("%w: %w", errClientGone, err)
	}
	return nil
}

// pinger sends a ping event whenever the stream was silent for s.ping.
func (st *stream) pinger() {
	t := time.NewTicker(st.srv.ping / 4)
	defer t.Stop()
	for {
		select {
		case <-st.done:
			return
		case <-st.ctx.Done():
			return
		case now := <-t.C:
			st.mu.Lock()
			if now.Sub(st.last) >= st.srv.ping {
				_ = st.writeLocked(api.Event{Type: api.EventPing, Time: now.UTC()})
			}
			st.mu.Unlock()
		}
	}
}

// finish ends the stream with the producer's result. It returns an error
// only when the stream never opened, for the handler to answer with a
// status; otherwise errors travel as a final error event.
func (st *stream) finish(err error) error {
	defer st.srv.streams.Done()
	defer st.cancel()
	defer st.stop()
	close(st.done)
	st.mu.Lock()
	defer st.mu.Unlock()
	log := st.srv.log.With("request_id", edge.RequestID(st.r.Context()), "sandbox_id", edge.SandboxID(st.r.Context()))
	draining := st.srv.drain.Err() != nil
	clientGone := st.gone || (st.r.Context().Err() != nil && !draining)
	switch {
	case clientGone:
		log.Debug("stream client went away; its producer was detached", "err", err)
	case draining:
		err = fmt.Errorf("server is shutting down; re-attach with after_seq: %w", errdefs.ErrUnavailable)
		fallthrough
	case err != nil:
		if !st.open {
			return err
		}
		e := st.srv.edge.Public(st.r.Context(), err)
		if e.Code == "internal" {
			log.Error("stream failed", "err", err)
		}
		_ = st.writeLocked(api.Event{Type: api.EventError, Time: time.Now().UTC(), Error: e})
	case !st.open:
		_ = st.openLocked()
	}
	st.closeLocked(clientGone, draining)
	return nil
}

func (st *stream) closeLocked(clientGone, draining bool) {
	if !st.open {
		return
	}
	if st.ws == nil {
		_ = http.NewResponseController(st.w).SetWriteDeadline(time.Time{})
		return
	}
	switch {
	case clientGone:
		_ = st.ws.CloseNow()
	case draining:
		_ = st.ws.Close(websocket.StatusGoingAway, "server shutting down")
	default:
		_ = st.ws.Close(websocket.StatusNormalClosure, "")
	}
}
