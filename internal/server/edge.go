package server

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/errdefs"
)

// The HTTP edge: what a client may hold of the server before and while it
// authenticates (config.Edge). Every route authenticates before it reads
// a body; a request whose body was not read to its end is answered with
// Connection: close and the rest of its body is not waited for (net/http
// would otherwise read up to 256 KiB of it, however slowly it comes,
// before sending the answer or closing the connection); request
// bodies have a progress deadline; requests served without credentials
// are capped; so are the connections that never carried an authenticated
// request, while they send a header or sit idle.

// Header timeouts of HTTPServer.
const (
	readHeaderTimeout = 10 * time.Second
	idleTimeout       = 2 * time.Minute
	maxHeaderBytes    = 128 << 10
)

// HTTPServer returns the http.Server to serve s with: header and idle
// timeouts, a bound on header size, and the cap on pending connections.
// errLog may be nil.
func (s *Server) HTTPServer(errLog *log.Logger) *http.Server {
	return &http.Server{
		Handler:           s,
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ConnContext:       s.conns.connContext,
		ConnState:         s.conns.connState,
		ErrorLog:          errLog,
	}
}

// admit records how request r is authorized: by a credential (an API
// key, a sandbox's token or a URL signature), or by none (a public
// route). Requests without one are capped (config.Edge.MaxAnonymous):
// beyond the cap they get a resource-exhausted error (429).
func (s *Server) admit(r *http.Request, credentialed bool) error {
	ri := info(r.Context())
	if credentialed {
		ri.credentialed = true
		return nil
	}
	if ri.anon || ri.credentialed || ri.key != nil || s.anon == nil {
		return nil
	}
	select {
	case s.anon <- struct{}{}:
		ri.anon = true // released when the request ends (observe)
		return nil
	default:
		return fmt.Errorf("too many requests without credentials at once (%d): retry later, or send an API key or the sandbox's token: %w",
			cap(s.anon), errdefs.ErrResourceExhausted)
	}
}

// done ends request ri's claims: its anonymous slot, and it makes its
// connection trusted if it carried a credential.
func (s *Server) done(ctx context.Context, ri *reqInfo) {
	if ri.anon {
		<-s.anon
		ri.anon = false
	}
	if ri.key != nil || ri.credentialed {
		s.conns.trust(ctx)
	}
}

// bodyTimeoutError is a request body that made too little progress.
type bodyTimeoutError struct {
	window time.Duration
	stream bool
}

func (e *bodyTimeoutError) Error() string {
	if e.stream {
		return fmt.Sprintf("request body timed out: nothing arrived for %v", e.window)
	}
	return fmt.Sprintf("request body timed out: less than %d KiB arrived in %v", config.BodyProgressBytes>>10, e.window)
}

// Unwrap classifies it; the response is a 408 whatever the handler makes
// of the error (recorder.WriteHeader).
func (e *bodyTimeoutError) Unwrap() error { return errdefs.ErrDeadlineExceeded }

// deadlineBody is a request body with a progress deadline: from its first
// read, at least config.BodyProgressBytes must arrive per window (a
// stream: at least one byte), else reads fail with a bodyTimeoutError. The
// deadline is the connection's read deadline, so a blocked read ends at
// once; it is cleared when the body ends, so that it cannot cut the
// connection while a long response streams.
type deadlineBody struct {
	rc     io.ReadCloser
	ctl    *http.ResponseController
	window time.Duration

	stream   atomic.Bool // SetStreaming: an idle deadline only
	armed    bool        // the reader's own state
	progress int
	finished atomic.Bool // the body ended (EOF, error or timeout)
	eof      atomic.Bool
	timedOut atomic.Bool
}

func newDeadlineBody(rc io.ReadCloser, w http.ResponseWriter, window time.Duration) *deadlineBody {
	return &deadlineBody{rc: rc, ctl: http.NewResponseController(w), window: window}
}

// SetStreaming makes the deadline an idle one: any byte extends it. For
// bodies that are streams a client may feed slowly (a command's stdin, an
// exposed port's upload).
func (b *deadlineBody) SetStreaming() { b.stream.Store(true) }

func (b *deadlineBody) Read(p []byte) (int, error) {
	if b.finished.Load() {
		return b.rc.Read(p)
	}
	if !b.armed {
		b.armed = true
		b.extend()
	}
	n, err := b.rc.Read(p)
	b.progress += n
	if n > 0 && (b.stream.Load() || b.progress >= config.BodyProgressBytes) {
		b.progress = 0
		b.extend()
	}
	switch {
	case err == nil:
	case isTimeout(err):
		b.timedOut.Store(true)
		b.finished.Store(true)
		return n, &bodyTimeoutError{window: b.window, stream: b.stream.Load()}
	default:
		b.finished.Store(true)
		b.eof.Store(errors.Is(err, io.EOF))
		_ = b.ctl.SetReadDeadline(time.Time{})
	}
	return n, err
}

func (b *deadlineBody) Close() error { return b.rc.Close() }

func (b *deadlineBody) extend() { _ = b.ctl.SetReadDeadline(time.Now().Add(b.window)) }

// abandon is called when the handler returned without reading the body
// to its end: net/http would then read up to 256 KiB more of it (however
// slowly it comes) before it closes the connection; the past read
// deadline makes that read fail at once.
func (b *deadlineBody) abandon() {
	b.finished.Store(true)
	_ = b.ctl.SetReadDeadline(time.Now())
}

// unread reports whether the body may still hold data nobody read.
func (b *deadlineBody) unread() bool { return b != nil && !b.eof.Load() }

func isTimeout(err error) bool {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	ne, ok := errors.AsType[net.Error](err)
	return ok && ne.Timeout()
}

// connTracker caps the pending connections: those that never carried an
// authenticated request and are waiting for a request header (new, or
// idle between requests). Beyond config.Edge.MaxPendingConns the oldest
// is closed: a client that holds connections without completing a
// request loses them to newer ones, while a real client's header arrives
// within moments. Connections on which a request authenticated are never
// counted (idle ones are bounded by the idle timeout).
type connTracker struct {
	max int

	mu      sync.Mutex
	pending *list.List // of *trackedConn, oldest first
	conns   map[net.Conn]*trackedConn
}

type trackedConn struct {
	c       net.Conn
	el      *list.Element // in pending, or nil
	trusted bool
}

type connKey struct{}

func newConnTracker(max int) *connTracker {
	return &connTracker{max: max, pending: list.New(), conns: map[net.Conn]*trackedConn{}}
}

func (t *connTracker) connContext(ctx context.Context, c net.Conn) context.Context {
	tc := &trackedConn{c: c}
	t.mu.Lock()
	t.conns[c] = tc
	t.mu.Unlock()
	return context.WithValue(ctx, connKey{}, tc)
}

func (t *connTracker) connState(c net.Conn, st http.ConnState) {
	var evict []net.Conn
	t.mu.Lock()
	tc := t.conns[c]
	if tc == nil {
		t.mu.Unlock()
		return
	}
	switch st {
	case http.StateNew, http.StateIdle:
		if !tc.trusted && tc.el == nil {
			tc.el = t.pending.PushBack(tc)
		}
		for t.pending.Len() > t.max {
			old := t.pending.Remove(t.pending.Front()).(*trackedConn)
			old.el = nil
			evict = append(evict, old.c)
		}
	case http.StateActive:
		t.unpend(tc)
	case http.StateHijacked, http.StateClosed:
		t.unpend(tc)
		delete(t.conns, c)
	}
	t.mu.Unlock()
	for _, c := range evict {
		_ = c.Close()
	}
}

func (t *connTracker) unpend(tc *trackedConn) {
	if tc.el != nil {
		t.pending.Remove(tc.el)
		tc.el = nil
	}
}

// trust marks the connection of a request context as having carried an
// authenticated request.
func (t *connTracker) trust(ctx context.Context) {
	tc, ok := ctx.Value(connKey{}).(*trackedConn)
	if !ok {
		return // not served through HTTPServer
	}
	t.mu.Lock()
	tc.trusted = true
	t.unpend(tc)
	t.mu.Unlock()
}
