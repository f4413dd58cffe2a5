package cluster

import (
	"bytes"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"time"

	"github.com/kiln-sh/kiln/internal/edge"
	"github.com/kiln-sh/kiln/internal/errdefs"
)

// dialTimeout bounds connecting to a node: a node that is down or cut
// off fails a request in this long rather than hanging it.
const dialTimeout = 2 * time.Second

// Proxy forwards requests from a front to nodes, with the cluster token.
// Streams flow both ways as they come (NDJSON is flushed at once,
// WebSocket and other upgrades are spliced), and a client that goes away
// cancels the node's request.
type Proxy struct {
	token string
	tr    *http.Transport
	log   *slog.Logger

	mu       sync.Mutex
	next     uint64
	inFlight map[string]map[uint64]context.CancelCauseFunc // by node
}

// Fail writes err (an errdefs class) as a front's error answer, in the
// shape of the API the request is for.
type Fail func(w http.ResponseWriter, r *http.Request, err error)

// NewProxy returns a Proxy that authenticates with token.
func NewProxy(token string, log *slog.Logger) *Proxy {
	d := &net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}
	return &Proxy{
		token: token, log: log, inFlight: map[string]map[uint64]context.CancelCauseFunc{},
		tr: &http.Transport{
			DialContext: d.DialContext, MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second,
			TLSHandshakeTimeout: 5 * time.Second, ExpectContinueTimeout: time.Second,
		},
	}
}

// Close drops idle connections to nodes.
func (p *Proxy) Close() { p.tr.CloseIdleConnections() }

// Forward proxies r to node n and writes the node's answer to w; a node
// that does not answer is answered with fail (errdefs.ErrUnavailable,
// naming the node).
func (p *Proxy) Forward(w http.ResponseWriter, r *http.Request, n Node, fail Fail) {
	p.forward(w, r, n, fail, false)
}

// ForwardHost is Forward keeping the client's Host header (rather than
// the node's): E2B's data plane shows it to a sandbox's server.
func (p *Proxy) ForwardHost(w http.ResponseWriter, r *http.Request, n Node, fail Fail) {
	p.forward(w, r, n, fail, true)
}

func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, n Node, fail Fail, keepHost bool) {
	target, err := url.Parse(n.URL)
	if err != nil {
		fail(w, r, fmt.Errorf("node %s has a bad URL in the catalog: %w", n.Name, err))
		return
	}
	ctx, done := p.track(r.Context(), n.Name)
	defer done()
	r = r.WithContext(ctx)
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			if keepHost {
				pr.Out.Host = pr.In.Host
			}
			pr.SetXForwarded()
			pr.Out.Header.Set(TokenHeader, p.token)
			pr.Out.Header.Set(RequestIDHeader, edge.RequestID(pr.In.Context()))
		},
		// The node answers with the same request id the front's edge
		// set: keep one X-Request-Id.
		ModifyResponse: func(resp *http.Response) error {
			resp.Header.Del("X-Request-Id")
			return nil
		},
		Transport:     p.tr,
		FlushInterval: -1, // streams: every write at once
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if cut := context.Cause(r.Context()); errors.Is(cut, errdefs.ErrUnavailable) {
				p.log.Warn("proxying to node: cut off", "node", n.Name, "url", n.URL, "err", cut)
				fail(w, r, cut)
				return
			}
			if r.Context().Err() != nil {
				return // the client went away: nobody to answer
			}
			p.log.Warn("proxying to node", "node", n.Name, "url", n.URL, "err", err)
			fail(w, r, fmt.Errorf("node %s is not answering: %w", n.Name, errdefs.ErrUnavailable))
		},
	}
	// The node may answer before the front has sent it all of the
	// request's body (it reads it through this same body): without full
	// duplex, the front's HTTP/1 server would start discarding that body
	// when the answer's headers go out, racing the transport that is
	// still sending it, and a lost race cut the answer short
	// (BenchmarkCluster saw one E2B /execute in a few hundred end in
	// "unexpected EOF"). Not every writer can (HTTP/2 always is).
	_ = http.NewResponseController(w).EnableFullDuplex()
	rp.ServeHTTP(w, r)
}

// ErrNotDelivered marks a Send that never reached the node (it could not
// be connected to): the request was certainly not acted on, so another
// node may be tried. A request that reached the node and got no answer
// may have been acted on, and must not be sent elsewhere.
var ErrNotDelivered = errors.New("request not delivered")

// Send sends a copy of r with body to node n (the path and query of r,
// the client's headers, the cluster token) and returns the node's
// answer, for a caller that may try another node. A node that does not
// answer is errdefs.ErrUnavailable naming it, and also ErrNotDelivered
// when it could not be connected to.
func (p *Proxy) Send(ctx context.Context, r *http.Request, body []byte, n Node) (resp *http.Response, err error) {
	u, err := url.Parse(n.URL)
	if err != nil {
		return nil, fmt.Errorf("node %s has a bad URL in the catalog: %w", n.Name, err)
	}
	u = u.JoinPath(r.URL.Path)
	u.RawQuery = r.URL.RawQuery
	tctx, done := p.track(ctx, n.Name)
	defer func() {
		if err != nil {
			done()
		}
	}()
	out, err := http.NewRequestWithContext(tctx, r.Method, u.String(), bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("making the request to node %s: %w", n.Name, err)
	}
	for k, vs := range r.Header {
		if k != "Connection" && k != "Content-Length" {
			out.Header[k] = vs
		}
	}
	out.Header.Set(TokenHeader, p.token)
	out.Header.Set(RequestIDHeader, edge.RequestID(ctx))
	resp, err = p.tr.RoundTrip(out)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if cut := context.Cause(tctx); errors.Is(cut, errdefs.ErrUnavailable) {
			p.log.Warn("sending to node: cut off", "node", n.Name, "url", n.URL, "err", cut)
			return nil, cut
		}
		p.log.Warn("sending to node", "node", n.Name, "url", n.URL, "err", err)
		if op, ok := errors.AsType[*net.OpError](err); ok && op.Op == "dial" {
			return nil, fmt.Errorf("node %s is not answering: %w: %w", n.Name, errdefs.ErrUnavailable, ErrNotDelivered)
		}
		return nil, fmt.Errorf("node %s is not answering: %w", n.Name, errdefs.ErrUnavailable)
	}
	resp.Body = doneBody{resp.Body, done}
	return resp, nil
}

// doneBody calls done once the body is closed: the request is in flight
// until then.
type doneBody struct {
	io.ReadCloser
	done func()
}

func (b doneBody) Close() error {
	err := b.ReadCloser.Close()
	b.done()
	return err
}

// track registers a request to node in flight: Watch cancels ctx (the
// request's) if the node stops answering. done, which may be called more
// than once, unregisters it.
func (p *Proxy) track(ctx context.Context, node string) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	p.mu.Lock()
	p.next++
	id := p.next
	if p.inFlight[node] == nil {
		p.inFlight[node] = map[uint64]context.CancelCauseFunc{}
	}
	p.inFlight[node][id] = cancel
	p.mu.Unlock()
	var once sync.Once
	return ctx, func() {
		once.Do(func() {
			p.mu.Lock()
			delete(p.inFlight[node], id)
			if len(p.inFlight[node]) == 0 {
				delete(p.inFlight, node)
			}
			p.mu.Unlock()
			cancel(nil)
		})
	}
}

// Watch cuts, every tick until ctx ends, the requests in flight to nodes
// that stopped answering (Directory.Answering: silent for too long, or
// marked lost): their clients get errdefs.ErrUnavailable naming the node
// instead of waiting on a node that accepted the connection and will not
// answer (a stopped process, a partition). Streams and WebSockets to such
// a node are cut likewise; those to answering nodes run for as long as
// they last.
func (p *Proxy) Watch(ctx context.Context, d *Directory, tick time.Duration) {
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p.mu.Lock()
		names := make([]string, 0, len(p.inFlight))
		for name := range p.inFlight {
			names = append(names, name)
		}
		p.mu.Unlock()
		for _, name := range names {
			n, err := d.Node(ctx, name)
			if err != nil {
				continue // the catalog cannot say: no proof the node is gone
			}
			why := d.Answering(n)
			if why == nil {
				continue
			}
			p.mu.Lock()
			for _, cancel := range p.inFlight[name] {
				cancel(why)
			}
			p.mu.Unlock()
		}
	}
}

// CopyResponse writes a node's answer to w.
func CopyResponse(w http.ResponseWriter, resp *http.Response) error {
	defer resp.Body.Close()
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(resp.StatusCode)
	_, err := io.Copy(w, resp.Body)
	return err
}

// TokenOK reports whether r carries the cluster token, in constant time.
func TokenOK(r *http.Request, token string) bool {
	got := r.Header.Get(TokenHeader)
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(token)) == 1
}
