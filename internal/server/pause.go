package server

import (
	"fmt"
	"net/http"
	"time"
)

// pauseSandbox pauses a running sandbox (see sandbox.Manager.Pause).
func (s *Server) pauseSandbox(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.lookup(r)
	if err != nil {
		return err
	}
	start := time.Now()
	sb, err = s.m.Pause(r.Context(), sb.ID)
	s.metrics.ObserveOp("pause", time.Since(start), errCode(err))
	if err != nil {
		return fmt.Errorf("pausing sandbox: %w", err)
	}
	return writeJSON(w, http.StatusOK, toAPI(sb))
}

// resumeSandbox resumes a paused sandbox (see sandbox.Manager.Resume).
func (s *Server) resumeSandbox(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.lookup(r)
	if err != nil {
		return err
	}
	start := time.Now()
	sb, err = s.m.Resume(r.Context(), sb.ID)
	s.metrics.ObserveOp("resume", time.Since(start), errCode(err))
	if err != nil {
		return fmt.Errorf("resuming sandbox: %w", err)
	}
	return writeJSON(w, http.StatusOK, toAPI(sb))
}
