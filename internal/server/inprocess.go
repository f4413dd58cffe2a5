package server

import (
	"fmt"
	"io"
	"net/http"
	"sync"

	"github.com/kiln-sh/kiln/client"
)

// inProcessURL is the base URL of in-process clients; no connection is
// ever made to it.
const inProcessURL = "http://kiln.in-process"

// inProcessClient returns an SDK client whose requests this server serves
// in-process, authenticated with secret: the tools (MCP sessions, tool
// calls) then get exactly the API's auth, tenancy, quotas, validation and
// error mapping without a loopback connection.
func (s *Server) inProcessClient(secret string) *client.Client {
	return client.New(inProcessURL, secret, client.WithHTTPClient(&http.Client{Transport: handlerTransport{s}}))
}

// handlerTransport is an http.RoundTripper that serves each request with
// a handler on a new goroutine. The response is returned when the handler
// writes its header (or returns); the body streams through a pipe, so
// NDJSON streams work and a reader that closes the body stops the handler's
// writes.
type handlerTransport struct{ h http.Handler }

func (t handlerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	r := req.Clone(req.Context())
	if r.Body == nil {
		r.Body = http.NoBody
	}
	r.RemoteAddr = "in-process"
	r.RequestURI = r.URL.RequestURI()
	pr, pw := io.Pipe()
	w := &pipeWriter{header: http.Header{}, body: pw, ready: make(chan struct{})}
	go func() {
		defer func() {
			// The handlers recover their own panics except
			// http.ErrAbortHandler, a deliberately broken response.
			if v := recover(); v != nil {
				w.WriteHeader(http.StatusInternalServerError) // unless the header went
				pw.CloseWithError(fmt.Errorf("in-process handler aborted: %v", v))
				return
			}
			w.WriteHeader(http.StatusOK) // a handler that wrote nothing
			pw.Close()
		}()
		t.h.ServeHTTP(w, r)
	}()
	select {
	case <-w.ready:
	case <-req.Context().Done():
		pr.CloseWithError(req.Context().Err())
		return nil, req.Context().Err()
	}
	return &http.Response{
		Status: http.StatusText(w.status), StatusCode: w.status, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: w.sent, Body: pr, ContentLength: -1, Request: req,
	}, nil
}

// pipeWriter is the ResponseWriter of an in-process request.
type pipeWriter struct {
	header http.Header
	body   *io.PipeWriter
	once   sync.Once
	ready  chan struct{} // closed by the first WriteHeader
	status int
	sent   http.Header // the header as WriteHeader saw it
}

func (w *pipeWriter) Header() http.Header { return w.header }

func (w *pipeWriter) WriteHeader(code int) {
	w.once.Do(func() {
		w.status, w.sent = code, w.header.Clone()
		close(w.ready)
	})
}

func (w *pipeWriter) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.body.Write(b)
}

// Flush is a no-op: every Write reaches the reader at once.
func (w *pipeWriter) Flush() {}
