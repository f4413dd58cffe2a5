package server

import (
	"log/slog"
	"net/http"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/e2b"
)

// mountE2B builds E2B's API (package e2b) from o, logging to log, with this server's
// key handling, error mapping and request log, and returns next with it
// in front: requests e2b.Routed picks go there, the rest to next. Its
// routes are not in Routes(): api/openapi.yaml documents Kiln's own API.
func (s *Server) mountE2B(o *e2b.Options, log *slog.Logger, next http.Handler) http.Handler {
	if o == nil {
		return next
	}
	eo := *o
	eo.Manager, eo.Images, eo.Log = s.m, s.im, log
	eo.Authenticate = s.e2bCaller
	eo.Admit = s.admit
	eo.Problem = s.e2bProblem
	eo.Annotate = func(r *http.Request, id string) { info(r.Context()).sandboxID = id }
	eo.ObserveCreate = func(d time.Duration, err error) { s.metrics.ObserveCreate(d, errCode(err)) }
	if eo.PortProxy == nil {
		eo.PortProxy = s.portProxy().ServePort
	}
	h := e2b.New(eo)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if e2b.Routed(r) {
			defer s.recover(w, r)
			h.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// e2bCaller authenticates an E2B request's API key (X-API-KEY) as any
// other request's: on the control plane, and on the data plane when it
// carries a key rather than the sandbox's token.
func (s *Server) e2bCaller(r *http.Request) (e2b.Caller, error) {
	if err := s.authenticate(r, 0); err != nil {
		return e2b.Caller{}, err
	}
	k := caller(r)
	return e2b.Caller{Owner: k.ID, Quota: s.quota(k), Admin: k.Admin}, nil
}

// e2bProblem is the status and client-visible message of err, logged as
// writeError logs.
func (s *Server) e2bProblem(r *http.Request, err error) (int, string) {
	e := s.apiError(r, err)
	if e.Code == api.CodeInternal {
		s.log.Error("internal error", "request_id", e.RequestID, "method", r.Method, "path", r.URL.Path, "err", err)
	}
	return Status(e.Code), e.Message
}
