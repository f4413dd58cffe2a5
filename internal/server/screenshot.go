package server

import (
	"net/http"
	"strconv"

	"github.com/kiln-sh/kiln/internal/sandbox"
)

// screenshot answers GET /v1/sandboxes/{id}/screenshot[?display=:0]: a
// PNG of the sandbox's X screen (sandbox.Agent.Screenshot). A sandbox
// with no desktop up is failed_precondition saying so.
func (s *Server) screenshot(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	if err := checkQuery(q, "display"); err != nil {
		return err
	}
	if d := q.Get("display"); d != "" {
		if err := sandbox.CheckDisplay(d); err != nil {
			return err
		}
	}
	a, err := s.agent(r)
	if err != nil {
		return err
	}
	shot, err := a.Screenshot(r.Context(), q.Get("display"))
	if err != nil {
		return err
	}
	h := w.Header()
	h.Set("Content-Type", "image/png")
	h.Set("Content-Length", strconv.Itoa(len(shot.PNG)))
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	_, err = w.Write(shot.PNG)
	return err
}
