// Package proxy serves the ports that processes in sandboxes listen on
// (exposed ports) to HTTP clients: plain requests, streamed responses and
// protocol upgrades (WebSocket), with access control. Which sandbox and
// port a request is for is decided by the router in front (package e2b:
// the <port>-<id>.<domain> host or the E2b-Sandbox-Id/-Port headers).
package proxy

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"time"

	"github.com/kiln-sh/kiln/internal/network"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// Headers that carry a sandbox's traffic access token. E2B's SDKs send the
// first when a sandbox's public traffic is off.
const (
	HeaderTrafficToken = "E2b-Traffic-Access-Token"
	HeaderKilnToken    = "X-Kiln-Traffic-Token"
)

// Proxy forwards requests to sandbox ports.
type Proxy struct {
	m   *sandbox.Manager
	log *slog.Logger
	// authorize reports whether r carries credentials (an API key) that
	// may use sandbox sb; it may consume r's credential headers.
	authorize func(r *http.Request, sb sandbox.Sandbox) bool
	rp        *httputil.ReverseProxy
}

// New returns a proxy to m's sandboxes. authorize decides for requests to
// non-public sandboxes that carry no traffic token; nil refuses them.
func New(m *sandbox.Manager, authorize func(r *http.Request, sb sandbox.Sandbox) bool, log *slog.Logger) *Proxy {
	p := &Proxy{m: m, log: log, authorize: authorize}
	tr := &http.Transport{
		// The URL's host is "<id>:<port>"; dial it through the sandbox's
		// network.
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			host, portStr, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			id, err := sandbox.ParseID(host)
			if err != nil {
				return nil, err
			}
			port, err := strconv.Atoi(portStr)
			if err != nil {
				return nil, err
			}
			return m.DialPort(ctx, id, port)
		},
		MaxIdleConnsPerHost:   8,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: 0, // long polls and slow apps are the app's business
		DisableCompression:    true,
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			t := target(pr.In.Context())
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = t.id.String() + ":" + strconv.Itoa(t.port)
			// Apps see the host the client used, or the sandbox's mask.
			pr.Out.Host = network.MaskedHost(t.mask, pr.In.Host, t.port)
			pr.SetXForwarded()
			for _, h := range []string{HeaderTrafficToken, HeaderKilnToken, "X-Api-Key"} {
				pr.Out.Header.Del(h)
			}
			if t.stripAuth {
				pr.Out.Header.Del("Authorization")
			}
		},
		Transport:     tr,
		FlushInterval: -1, // stream: server-sent events, chunked output
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			t := target(r.Context())
			if !errors.Is(err, context.Canceled) {
				p.log.Debug("proxying to sandbox port", "sandbox_id", t.id, "port", t.port, "err", err)
			}
			portClosed(w, t.id, t.port)
		},
	}
	return p
}

type targetKey struct{}

// grantKey marks a request whose credential the router in front has
// already verified (see Grant).
type grantKey struct{}

type grant struct{ stripAuth bool }

// Grant marks r as carrying a credential the router verified for the
// sandbox it is routed to (its traffic token, or an API key that owns
// it), so that ServePort lets it through whether or not the ports are
// public; stripAuth says the credential was an Authorization header,
// which then is not passed on to the sandbox.
func Grant(r *http.Request, stripAuth bool) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), grantKey{}, grant{stripAuth: stripAuth}))
}

// Forbidden answers a request for a non-public sandbox's port that
// carries no credential for it.
func Forbidden(w http.ResponseWriter, id sandbox.ID) {
	writeJSON(w, http.StatusForbidden, map[string]any{"code": http.StatusForbidden,
		"message": "this sandbox's ports are not public: send its traffic access token (" +
			HeaderTrafficToken + ") or an API key that owns it", "sandboxId": id.String()})
}

type proxyTarget struct {
	id        sandbox.ID
	port      int
	stripAuth bool   // Authorization carried our API key: do not pass it on
	mask      string // the sandbox's mask host, "" for none
}

func target(ctx context.Context) proxyTarget {
	t, _ := ctx.Value(targetKey{}).(proxyTarget)
	return t
}

// ServePort forwards r to port of sandbox sb (the e2b.Options.PortProxy
// hook). Non-public sandboxes need the traffic token or an authorized
// API key (403 otherwise), unless the router granted r (Grant); sandboxes
// without a network have no token of their own and are never public. A
// closed port or a sandbox that died answers 502.
func (p *Proxy) ServePort(w http.ResponseWriter, r *http.Request, sb sandbox.Sandbox, port int) {
	info, err := p.m.Network(sb.ID)
	if err != nil {
		portClosed(w, sb.ID, port)
		return
	}
	t := proxyTarget{id: sb.ID, port: port, mask: info.MaskHost}
	if g, ok := r.Context().Value(grantKey{}).(grant); ok {
		t.stripAuth = g.stripAuth
	} else if !info.Public {
		tok := r.Header.Get(HeaderTrafficToken)
		if tok == "" {
			tok = r.Header.Get(HeaderKilnToken)
		}
		switch {
		case tok != "" && info.Token != "" && subtle.ConstantTimeCompare([]byte(tok), []byte(info.Token)) == 1:
		case tok == "" && p.authorize != nil && p.authorize(r, sb):
			t.stripAuth = true
		default:
			Forbidden(w, sb.ID)
			return
		}
	}
	p.rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), targetKey{}, t)))
}

// portClosed is E2B's answer for a port nothing listens on.
func portClosed(w http.ResponseWriter, id sandbox.ID, port int) {
	writeJSON(w, http.StatusBadGateway, map[string]any{"code": http.StatusBadGateway,
		"message": "The sandbox is running but port is not open", "sandboxId": id.String(), "port": port})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
