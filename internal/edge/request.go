package edge

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net/http"
	"time"

	"github.com/kiln-sh/kiln/internal/apikey"
)

// info is what the edge learns about a request as it is served.
type info struct {
	id           string
	method, path string
	key          *apikey.Key // set by Authenticate
	sandboxID    string      // set by Annotate
	// credentialed: a sandbox's token or a URL signature authorized the
	// request (Admit); anon: it holds an anonymous slot.
	credentialed, anon bool
	body               *deadlineBody // nil for requests without a body
}

type infoKey struct{}

// infoOf returns the info of a request served through Handler (or
// Begin), else nil.
func infoOf(ctx context.Context) *info {
	ri, _ := ctx.Value(infoKey{}).(*info)
	return ri
}

// RequestID is the id of the request ctx belongs to (its X-Request-Id);
// "" outside a request served through Handler.
func RequestID(ctx context.Context) string {
	if ri := infoOf(ctx); ri != nil {
		return ri.id
	}
	return ""
}

// AdoptRequestID makes id, a request id another Kiln process gave the
// request (a cluster front, for the node it proxies to), r's own: in the
// request log, in errors and in w's X-Request-Id. The caller must have
// authenticated that process; an id that is not 16 hex digits is
// ignored.
func AdoptRequestID(w http.ResponseWriter, r *http.Request, id string) {
	ri := infoOf(r.Context())
	if ri == nil || len(id) != 16 {
		return
	}
	if _, err := hex.DecodeString(id); err != nil {
		return
	}
	ri.id = id
	w.Header().Set("X-Request-Id", id)
}

// Key is the API key the request of ctx authenticated with (the zero Key
// if none).
func Key(ctx context.Context) apikey.Key {
	if ri := infoOf(ctx); ri != nil && ri.key != nil {
		return *ri.key
	}
	return apikey.Key{}
}

// Annotate tells the request log which sandbox r is about.
func Annotate(r *http.Request, sandboxID string) {
	if ri := infoOf(r.Context()); ri != nil {
		ri.sandboxID = sandboxID
	}
}

// SandboxID is the sandbox the request of ctx was annotated with.
func SandboxID(ctx context.Context) string {
	if ri := infoOf(ctx); ri != nil {
		return ri.sandboxID
	}
	return ""
}

// StreamBody tells r's body deadline that the body is a stream (a
// command's stdin, an exposed port's upload), which may pause but not
// stall: any byte extends it.
func StreamBody(r *http.Request) {
	if b, ok := r.Body.(*deadlineBody); ok {
		b.SetStreaming()
	}
}

// Begin gives r a new request id and the edge's request info; Handler
// does it for every request (and End ends it).
func (e *Edge) Begin(r *http.Request) *http.Request {
	ri := &info{id: newRequestID(), method: r.Method, path: r.URL.Path}
	return r.WithContext(context.WithValue(r.Context(), infoKey{}, ri))
}

// Handler serves next behind the edge: every request gets an id
// (X-Request-Id) and a body deadline; its status is recorded, logged and
// measured by route pattern.
func (e *Edge) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		r = e.Begin(r)
		ri := infoOf(r.Context())
		w.Header().Set("X-Request-Id", ri.id)
		if r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0 {
			ri.body = newDeadlineBody(r.Body, w, e.cfg.BodyTimeout)
			r.Body = ri.body
		}
		rec := &recorder{ResponseWriter: w, ri: ri}
		// Logged even when a handler aborts with http.ErrAbortHandler.
		defer func() {
			e.End(r)
			e.logRequest(r, rec, ri, time.Since(start))
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

func (e *Edge) logRequest(r *http.Request, rec *recorder, ri *info, d time.Duration) {
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
	e.metrics.ObserveRequest(route, status, d)
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
	e.log.LogAttrs(r.Context(), slog.LevelInfo, "request", attrs...)
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
	ri       *info
	status   int
	bytes    int64
	hijacked bool
}

// WriteHeader also applies the edge's rules to the first final status:
// a request whose body timed out is answered 408 (whatever error the
// handler made of it), and the connection is closed after a 401 or when
// the body was not read to its end (see conn.go).
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

// Started reports whether a response has begun, so an error can no
// longer be sent as a status.
func Started(w http.ResponseWriter) bool {
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

// Hijacked records that the connection was taken over (WebSocket).
func Hijacked(w http.ResponseWriter) {
	if rec, ok := w.(*recorder); ok {
		rec.hijacked = true
	}
}
