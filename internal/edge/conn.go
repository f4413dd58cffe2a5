package edge

import (
	"container/list"
	"context"
	"fmt"
	"log"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// What a client may hold of the server before and while it
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

// HTTPServer returns the http.Server to serve h (a handler behind
// e.Handler) with: header and idle timeouts, a bound on header size, and
// the cap on pending connections. errLog may be nil.
func (e *Edge) HTTPServer(h http.Handler, errLog *log.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ConnContext:       e.conns.connContext,
		ConnState:         e.conns.connState,
		ErrorLog:          errLog,
	}
}

// Admit records how request r is authorized: by a credential (an API
// key, a sandbox's token or a URL signature), or by none (a public
// route). Requests without one are capped (config.Edge.MaxAnonymous):
// beyond the cap they get a resource-exhausted error (429). Requests not
// served through Handler are not counted.
func (e *Edge) Admit(r *http.Request, credentialed bool) error {
	ri := infoOf(r.Context())
	if e == nil || ri == nil {
		return nil
	}
	if credentialed {
		ri.credentialed = true
		return nil
	}
	if ri.anon || ri.credentialed || ri.key != nil || e.anon == nil {
		return nil
	}
	select {
	case e.anon <- struct{}{}:
		ri.anon = true // released when the request ends (End)
		return nil
	default:
		return fmt.Errorf("too many requests without credentials at once (%d): retry later, or send an API key or the sandbox's token: %w",
			cap(e.anon), errdefs.ErrResourceExhausted)
	}
}

// End ends request r's claims: its anonymous slot, and it makes its
// connection trusted if it carried a credential. Handler calls it when
// the request is served.
func (e *Edge) End(r *http.Request) {
	ri := infoOf(r.Context())
	if ri == nil {
		return
	}
	if ri.anon {
		<-e.anon
		ri.anon = false
	}
	if ri.key != nil || ri.credentialed {
		e.conns.trust(r.Context())
	}
}

// TrustConn makes r's connection trusted at once, as if it had carried
// an authenticated request: for a peer authenticated otherwise (a
// cluster front, by the cluster token), whose idle keep-alive
// connections must not be closed as a slow client's would.
func (e *Edge) TrustConn(r *http.Request) { e.conns.trust(r.Context()) }

// AnonymousHeld is how many requests without credentials hold a slot.
func (e *Edge) AnonymousHeld() int { return len(e.anon) }

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
