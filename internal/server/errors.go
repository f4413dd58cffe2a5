package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/errdefs"
)

// classes pairs each error class with its wire code, most specific first.
var classes = []struct {
	err  error
	code api.ErrorCode
}{
	{errdefs.ErrInvalidArgument, api.CodeInvalidArgument},
	{errdefs.ErrUnauthenticated, api.CodeUnauthenticated},
	{errdefs.ErrPermissionDenied, api.CodePermissionDenied},
	{errdefs.ErrNotFound, api.CodeNotFound},
	{errdefs.ErrAlreadyExists, api.CodeAlreadyExists},
	{errdefs.ErrFailedPrecondition, api.CodeFailedPrecondition},
	{errdefs.ErrResourceExhausted, api.CodeResourceExhausted},
	{errdefs.ErrUnavailable, api.CodeUnavailable},
	{errdefs.ErrDeadlineExceeded, api.CodeDeadlineExceeded},
	{context.DeadlineExceeded, api.CodeDeadlineExceeded},
}

// codeOf classifies err; unclassified errors are internal.
func codeOf(err error) api.ErrorCode {
	if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
		return api.CodeInvalidArgument
	}
	for _, c := range classes {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	return api.CodeInternal
}

// Status is the one mapping from error codes to HTTP statuses.
func Status(c api.ErrorCode) int {
	switch c {
	case api.CodeInvalidArgument:
		return http.StatusBadRequest
	case api.CodeUnauthenticated:
		return http.StatusUnauthorized
	case api.CodePermissionDenied:
		return http.StatusForbidden
	case api.CodeNotFound:
		return http.StatusNotFound
	case api.CodeAlreadyExists, api.CodeFailedPrecondition:
		return http.StatusConflict
	case api.CodeResourceExhausted:
		return http.StatusTooManyRequests
	case api.CodeDeadlineExceeded:
		return http.StatusGatewayTimeout
	case api.CodeUnavailable:
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// apiError is what a client may see of err: classified errors keep their
// message (host directories scrubbed), anything else becomes a generic
// internal error whose detail stays in the log.
func (s *Server) apiError(r *http.Request, err error) *api.Error {
	e := &api.Error{Code: codeOf(err), Message: err.Error(), RequestID: requestID(r.Context())}
	if mbe, ok := errors.AsType[*http.MaxBytesError](err); ok {
		e.Message = fmt.Sprintf("request body larger than %d bytes", mbe.Limit)
	}
	if e.Code == api.CodeInternal {
		e.Message = "internal error; the server log has details under this request id"
	}
	for _, dir := range []string{s.cfg.DataDir, s.cfg.RunDir} {
		if len(dir) > 1 {
			e.Message = strings.ReplaceAll(e.Message, dir, "…")
		}
	}
	// A backstop for inputs quoted without errdefs.Clip.
	e.Message = errdefs.ClipMessage(e.Message, maxErrorMessage)
	return e
}

// maxErrorMessage bounds an error message a client gets.
const maxErrorMessage = 1024

// writeError answers with err unless the response has begun (a stream),
// and logs what the client did not see.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	e := s.apiError(r, err)
	log := s.log.With("request_id", e.RequestID, "method", r.Method, "path", r.URL.Path)
	switch {
	case errors.Is(err, context.Canceled) && r.Context().Err() != nil:
		log.Debug("client went away", "err", err)
		return
	case e.Code == api.CodeInternal:
		log.Error("internal error", "err", err)
	default:
		log.Debug("request failed", "code", e.Code, "err", err)
	}
	if started(w) {
		return
	}
	writeJSON(w, Status(e.Code), e)
}

// writeJSON encodes v as the response.
func writeJSON(w http.ResponseWriter, status int, v any) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if err := json.NewEncoder(w).Encode(v); err != nil {
		return fmt.Errorf("writing response: %w", err)
	}
	return nil
}

// invalid makes an invalid_argument error.
func invalid(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, errdefs.ErrInvalidArgument)...)
}

// notFound answers routes that do not exist, and methods a path does not
// have.
func (s *Server) notFound(w http.ResponseWriter, r *http.Request) error {
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete} {
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, p := s.mux.Handler(probe); p != "/" && p != "" {
			allow = append(allow, m)
		}
	}
	if len(allow) == 0 {
		return fmt.Errorf("no route %s %s: %w", r.Method, r.URL.Path, errdefs.ErrNotFound)
	}
	w.Header().Set("Allow", strings.Join(allow, ", "))
	writeJSON(w, http.StatusMethodNotAllowed, &api.Error{
		Code:      api.CodeInvalidArgument,
		Message:   fmt.Sprintf("method %s not allowed here; allowed: %s", r.Method, strings.Join(allow, ", ")),
		RequestID: requestID(r.Context()),
	})
	return nil
}
