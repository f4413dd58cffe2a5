package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net/http"
	"time"

	"github.com/kiln-sh/kiln/internal/apikey"
)

// reqInfo is what the middleware learns about a request as it is served.
type reqInfo struct {
	id        string
	key       *apikey.Key // set by authenticate
	sandboxID string      // set by handlers of sandbox routes
	// credentialed: a sandbox's token or a URL signature authorized the
	// request (admit); anon: it holds an anonymous slot.
	credentialed, anon bool
	body               *deadlineBody // nil for requests without a body
}

type ctxKey struct{}

func info(ctx context.Context) *reqInfo {
	if ri, ok := ctx.Value(ctxKey{}).(*reqInfo); ok {
		return ri
	}
	return &reqInfo{}
}

func requestID(ctx context.Context) string { return info(ctx).id }

// observe gives every request an id (X-Request-Id), records its status,
// logs it and measures it by route pattern.
func (s *Server) observe(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		ri := &reqInfo{id: newRequestID()}
		r = r.WithContext(context.WithValue(r.Context(), ctxKey{}, ri))
		w.Header().Set("X-Request-Id", ri.id)
		if r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0 {
			ri.body = newDeadlineBody(r.Body, w, s.edge.BodyTimeout)
			r.Body = ri.body
		}
		rec := &recorder{ResponseWriter: w, ri: ri}
		// Logged even when a handler aborts with http.ErrAbortHandler.
		defer func() {
			s.done(r.Context(), ri)
			s.logRequest(r, rec, ri, time.Since(start))
		}()
		next.ServeHTTP(rec, r) // the mux sets r.Pattern
		if ri.body.unread() {
			if rec.status == 0 {
				w.Header().Set("Connection", "close") // for net/http's implicit 200
			}
			ri.body.abandon()
		}
	})
}

func (s *Server) logRequest(r *http.Request, rec *recorder, ri *reqInfo, d time.Duration) {
	status := rec.status
	if status == 0 {
		status = http.StatusOK
	}
	if rec.hijacked {
		status = http.StatusSwitchingProtocols
	}
	route := r.Pattern
	if route == "" || route == "/" {
		route = "unmatched"
	}
	s.metrics.ObserveRequest(route, status, d)
	attrs := []slog.Attr{
		slog.String("request_id", ri.id), slog.String("method", r.Method), slog.String("route", route),
		slog.String("path", r.URL.Path), slog.Int("status", status), slog.Int64("bytes", rec.bytes),
		slog.Duration("duration", d), slog.String("remote", r.RemoteAddr),
	}
	if ri.sandboxID != "" {
		attrs = append(attrs, slog.String("sandbox_id", ri.sandboxID))
	}
	if ri.key != nil {
		attrs = append(attrs, slog.String("key_id", ri.key.ID))
	}
	s.log.LogAttrs(r.Context(), slog.LevelInfo, "request", attrs...)
}

func newRequestID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// recorder remembers the status and size of a response. Unwrap lets
// http.ResponseController and the WebSocket upgrade reach the
// connection's Flush and Hijack.
type recorder struct {
	http.ResponseWriter
	ri       *reqInfo
	status   int
	bytes    int64
	hijacked bool
}

// WriteHeader also applies the edge's rules to the first final status:
// a request whose body timed out is answered 408 (whatever error the
// handler made of it), and the connection is closed after a 401 or when
// the body was not read to its end (see edge.go).
func (w *recorder) WriteHeader(code int) {
	if w.status == 0 && code >= 200 { // 1xx are not final
		if b := w.ri.body; b != nil && b.timedOut.Load() && code >= 400 {
			code = http.StatusRequestTimeout
		}
		if code == http.StatusUnauthorized || w.ri.body.unread() {
			w.Header().Set("Connection", "close")
		}
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *recorder) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += int64(n)
	return n, err
}

func (w *recorder) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *recorder) Unwrap() http.ResponseWriter {
	// Only the WebSocket upgrade looks past Flush; assume it hijacks.
	return w.ResponseWriter
}

// started reports whether a response has begun, so an error can no
// longer be sent as a status.
func started(w http.ResponseWriter) bool {
	for {
		switch t := w.(type) {
		case *recorder:
			return t.status != 0 || t.hijacked
		case interface{ Unwrap() http.ResponseWriter }:
			w = t.Unwrap()
		default:
			return false
		}
	}
}

// markHijacked records that the connection was taken over (WebSocket).
func markHijacked(w http.ResponseWriter) {
	if rec, ok := w.(*recorder); ok {
		rec.hijacked = true
	}
}
