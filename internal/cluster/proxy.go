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
}

// Fail writes err (an errdefs class) as a front's error answer, in the
// shape of the API the request is for.
type Fail func(w http.ResponseWriter, r *http.Request, err error)

// NewProxy returns a Proxy that authenticates with token.
func NewProxy(token string, log *slog.Logger) *Proxy {
	d := &net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}
	return &Proxy{
		token: token, log: log,
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
	target, err := url.Parse(n.URL)
	if err != nil {
		fail(w, r, fmt.Errorf("node %s has a bad URL in the catalog: %w", n.Name, err))
		return
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
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
func (p *Proxy) Send(ctx context.Context, r *http.Request, body []byte, n Node) (*http.Response, error) {
	u, err := url.Parse(n.URL)
	if err != nil {
		return nil, fmt.Errorf("node %s has a bad URL in the catalog: %w", n.Name, err)
	}
	u = u.JoinPath(r.URL.Path)
	u.RawQuery = r.URL.RawQuery
	out, err := http.NewRequestWithContext(ctx, r.Method, u.String(), bytes.NewReader(body))
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
	resp, err := p.tr.RoundTrip(out)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		p.log.Warn("sending to node", "node", n.Name, "url", n.URL, "err", err)
		if op, ok := errors.AsType[*net.OpError](err); ok && op.Op == "dial" {
			return nil, fmt.Errorf("node %s is not answering: %w: %w", n.Name, errdefs.ErrUnavailable, ErrNotDelivered)
		}
		return nil, fmt.Errorf("node %s is not answering: %w", n.Name, errdefs.ErrUnavailable)
	}
	return resp, nil
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
