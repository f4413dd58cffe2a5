package tools

import (
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/kiln-sh/kiln/client"
)

// DefaultIdleTimeout ends an HTTP MCP session (and kills its sandbox)
// after this long without a request.
const DefaultIdleTimeout = 15 * time.Minute

const (
	// maxSessions bounds the live MCP sessions of a server; a session
	// without a sandbox costs memory only, until its idle timeout.
	maxSessions = 10000
	// maxUserSessions bounds those of one user (API key), so that one
	// cannot take them all.
	maxUserSessions = 100
	// maxRequestBody bounds one MCP message (code of up to 1 MiB,
	// escaped in JSON).
	maxRequestBody = 8 << 20
)

// HTTPOptions configure an HTTPHandler.
type HTTPOptions struct {
	Session     Options // for each session's Session
	Version     string
	IdleTimeout time.Duration // default DefaultIdleTimeout
	Log         *slog.Logger
	// Node, on a cluster node, is its name: session ids then carry it
	// (SessionNode), so that fronts route each session to its node.
	Node string
}

// HTTPHandler serves the tools over MCP's streamable HTTP transport. Each
// MCP session gets its own Session (one sandbox), calling Kiln through the
// client the caller's request yields; sessions end on DELETE, after the
// idle timeout, or on Close.
type HTTPHandler struct {
	h *mcp.StreamableHTTPHandler

	mu        sync.Mutex
	live      map[*Session]string // the user of each live session
	closed    bool
	closeOnce sync.Once
}

// NewHTTPHandler returns the handler. clientFor is asked, once per new
// session, for the client that session calls Kiln with: it carries the
// caller's API key, so the key's tenancy and quotas apply to the session's
// sandbox. Authenticate requests before they reach the handler; a request
// whose context has no auth.TokenInfo is served, but then sessions are not
// bound to a user.
func NewHTTPHandler(clientFor func(*http.Request) *client.Client, o HTTPOptions) *HTTPHandler {
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	if o.Session.Timeout <= 0 {
		// Outlive the session: calls push the sandbox's end back at
		// most every refreshEvery.
		o.Session.Timeout = o.IdleTimeout + refreshEvery
	}
	hh := &HTTPHandler{live: map[*Session]string{}}
	hh.h = mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server {
		var user string
		if ti := auth.TokenInfoFromContext(r.Context()); ti != nil {
			user = ti.UserID
		}
		if !hh.admit(user, nil) {
			return nil // 400: shutting down, or too many sessions
		}
		// The session counts once it is attached to its MCP session
		// (initialized, or its first call): a request that never gets
		// that far (a probe of the stateless protocol, a failed
		// initialize) leaves nothing behind.
		sess := NewSession(clientFor(r), o.Session)
		sess.onAttach = func() bool { return hh.admit(user, sess) }
		sess.onClose = func() {
			hh.mu.Lock()
			delete(hh.live, sess)
			hh.mu.Unlock()
		}
		return newMCPServer(sess, o.Version, o.Node)
	}, &mcp.StreamableHTTPOptions{
		SessionTimeout: o.IdleTimeout, Logger: o.Log, MaxRequestBodyBytes: maxRequestBody,
		// The SDK refuses loopback requests whose Host is not loopback,
		// against DNS rebinding of an unauthenticated local server. Every
		// /mcp request carries an API key (no cookies, nothing ambient),
		// and the check would refuse a reverse proxy on the same host.
		DisableLocalhostProtection: true,
	})
	return hh
}

func (hh *HTTPHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) { hh.h.ServeHTTP(w, r) }

// admit reports whether user may have another session, and if so counts
// sess (unless nil) as live.
func (hh *HTTPHandler) admit(user string, sess *Session) bool {
	hh.mu.Lock()
	defer hh.mu.Unlock()
	if hh.closed || len(hh.live) >= maxSessions {
		return false
	}
	if user != "" {
		n := 0
		for _, u := range hh.live {
			if u == user {
				n++
			}
		}
		if n >= maxUserSessions {
			return false
		}
	}
	if sess != nil {
		hh.live[sess] = user
	}
	return true
}

// Close ends every MCP session, kills their sandboxes and refuses new
// sessions. Concurrent calls wait for the first.
func (hh *HTTPHandler) Close() {
	hh.closeOnce.Do(func() {
		hh.mu.Lock()
		hh.closed = true
		live := hh.live
		hh.live = map[*Session]string{}
		hh.mu.Unlock()
		var wg sync.WaitGroup
		for s := range live {
			wg.Go(func() { s.end() })
		}
		wg.Wait()
	})
}

// Sessions returns the number of live sessions.
func (hh *HTTPHandler) Sessions() int {
	hh.mu.Lock()
	defer hh.mu.Unlock()
	return len(hh.live)
}
