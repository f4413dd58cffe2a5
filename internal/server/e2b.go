package server

import (
	"log/slog"
	"net/http"

	"github.com/kiln-sh/kiln/internal/e2b"
)

// mountE2B builds E2B's API (package e2b) from o, logging to log, behind
// this server's edge (keys, admission, errors, request log, metrics), and
// returns next with it in front: requests its Routed picks go there, the
// rest to next. Its routes are not in Routes(): api/openapi.yaml
// documents Kiln's own API.
func (s *Server) mountE2B(o *e2b.Options, log *slog.Logger, next http.Handler) http.Handler {
	if o == nil {
		return next
	}
	eo := *o
	eo.Manager, eo.Images, eo.Log, eo.Edge = s.m, s.im, log, s.edge
	if eo.Volumes == nil {
		eo.Volumes = s.volumes
	}
	if s.templatesOn() == nil {
		eo.Builder, eo.Catalog, eo.Limits = s.builder, s.catalog, s.cfg.Limits
	}
	if eo.PortProxy == nil {
		eo.PortProxy = s.portProxy().ServePort
	}
	h := e2b.New(eo)
	s.e2b = h
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h.Routed(r) {
			defer s.recover(w, r)
			h.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}
