// Package client is the Go SDK for Kiln's REST API (see docs/api.md and
// api/openapi.yaml). It imports only the standard library, the api
// package and the Dockerfile compiler (for [Client.BuildDockerfile]), so
// programs can embed it without pulling in the server.
//
// Every method takes a context first; cancelling it aborts the request, and
// for streaming methods stops reading the stream (a command keeps running in
// its sandbox, detached, and can be re-attached with [Client.Attach]).
//
// A non-2xx answer is returned as *[Error], which carries the API's
// {code, message, request_id} and the HTTP status:
//
//	400 invalid_argument     the request was malformed or a value was out of range
//	401 unauthenticated      the API key is missing, malformed, unknown or revoked
//	403 permission_denied    the key may not do this (e.g. a non-admin key managing keys)
//	404 not_found            no such sandbox, process or path — or one another key owns
//	409 already_exists       the thing to create exists already
//	409 failed_precondition  the sandbox is not in a state that allows this (e.g. stopped)
//	429 resource_exhausted   a quota or the host's capacity is used up
//	500 internal             a server bug; the request_id finds it in the server's logs
//	503 unavailable          the server or the sandbox's agent is not ready; retry later
//	504 deadline_exceeded    the server gave up waiting (e.g. for a sandbox to start)
//
// Use [IsCode] or errors.As with *[Error] (or *api.Error) to classify them.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
)

// DefaultURL is the server address [FromEnv] uses when KILN_URL is unset.
const DefaultURL = "http://127.0.0.1:8420"

// Client talks to one Kiln server with one API key. It is safe for
// concurrent use.
type Client struct {
	base string // without a trailing slash
	key  string
	hc   *http.Client
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient makes the Client send its requests through hc, e.g. to set
// a transport with TLS settings or a proxy. Give it no Timeout: streams last
// as long as their command; use contexts for deadlines instead.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) { c.hc = hc }
}

// New returns a Client for the server at baseURL (e.g.
// "http://127.0.0.1:8420"), authenticating with apiKey.
func New(baseURL, apiKey string, opts ...Option) *Client {
	c := &Client{base: strings.TrimRight(baseURL, "/"), key: apiKey, hc: &http.Client{}}
	for _, o := range opts {
		o(c)
	}
	return c
}

// FromEnv returns a Client for the server named by KILN_URL (default
// [DefaultURL]) with the key in KILN_API_KEY.
func FromEnv(opts ...Option) *Client {
	u := os.Getenv("KILN_URL")
	if u == "" {
		u = DefaultURL
	}
	return New(u, os.Getenv("KILN_API_KEY"), opts...)
}

// BaseURL returns the server address the Client talks to.
func (c *Client) BaseURL() string { return c.base }

// request describes one HTTP call.
type request struct {
	method string
	path   string // starting with /
	query  url.Values
	json   any       // encoded as the JSON body when non-nil
	body   io.Reader // raw body when json is nil
	ctype  string    // Content-Type of body
	accept string
}

// send performs r and returns the response if its status is 2xx; any other
// status is decoded into *Error and the body closed.
func (c *Client) send(ctx context.Context, r request) (*http.Response, error) {
	u := c.base + r.path
	if len(r.query) > 0 {
		u += "?" + r.query.Encode()
	}
	body, ctype := r.body, r.ctype
	if r.json != nil {
		b, err := json.Marshal(r.json)
		if err != nil {
			return nil, fmt.Errorf("encoding request: %w", err)
		}
		body, ctype = bytes.NewReader(b), "application/json"
	}
	req, err := http.NewRequestWithContext(ctx, r.method, u, body)
	if err != nil {
		return nil, err
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	accept := r.accept
	if accept == "" {
		accept = "application/json"
	}
	req.Header.Set("Accept", accept)
	req.Header.Set("User-Agent", "kiln-go-client")
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		return nil, decodeError(resp)
	}
	return resp, nil
}

// call performs a JSON request and decodes a JSON answer into out (unless
// out is nil, when the body is discarded).
func (c *Client) call(ctx context.Context, method, path string, query url.Values, in, out any) error {
	resp, err := c.send(ctx, request{method: method, path: path, query: query, json: in})
	if err != nil {
		return err
	}
	defer drain(resp.Body)
	if out == nil {
		return nil
	}
	return decodeJSON(resp, out)
}

// decodeJSON decodes a response body into out.
func decodeJSON(resp *http.Response, out any) error {
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decoding %s %s answer: %w", resp.Request.Method, resp.Request.URL.Path, err)
	}
	return nil
}

// drain reads a little of what is left of body so that the connection can
// be reused, then closes it.
func drain(body io.ReadCloser) {
	io.Copy(io.Discard, io.LimitReader(body, 64<<10))
	body.Close()
}

// sandboxPath returns /v1/sandboxes/{id} followed by elem.
func sandboxPath(id string, elem ...string) string {
	p := "/v1/sandboxes/" + url.PathEscape(id)
	for _, e := range elem {
		p += "/" + e
	}
	return p
}
