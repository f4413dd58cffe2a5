package server

import (
	"fmt"
	"net/http"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/errdefs"
)

func now() time.Time { return time.Now().UTC() }

func (s *Server) health(w http.ResponseWriter, r *http.Request) error {
	return writeJSON(w, http.StatusOK, api.Health{Status: "ok", Version: s.version})
}

func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request) error {
	if s.metrics == nil {
		return fmt.Errorf("metrics are not enabled: %w", errdefs.ErrNotFound)
	}
	s.metrics.Handler().ServeHTTP(w, r)
	return nil
}
