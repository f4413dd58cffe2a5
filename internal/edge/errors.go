package edge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/errdefs"
)

// Code classifies err: its class's API code (errdefs.Code), with a body
// over its size limit an invalid argument; unclassified errors are
// internal.
func Code(err error) api.ErrorCode {
	if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
		return api.CodeInvalidArgument
	}
	return errdefs.Code(err)
}

// CodeLabel is err's code as a metrics label: "" for success.
func CodeLabel(err error) string {
	if err == nil {
		return ""
	}
	return string(Code(err))
}

// maxMessage bounds an error message a client gets.
const maxMessage = 1024

// Public is what a client may see of err, for the request of ctx: a
// classified error keeps its message (host directories scrubbed, at most
// about 1 KiB), anything else is a generic internal error naming the
// request id. It logs nothing (Problem does).
func (e *Edge) Public(ctx context.Context, err error) *api.Error {
	e = e.or()
	ae := &api.Error{Code: Code(err), Message: err.Error(), RequestID: RequestID(ctx)}
	if mbe, ok := errors.AsType[*http.MaxBytesError](err); ok {
		ae.Message = fmt.Sprintf("request body larger than %d bytes", mbe.Limit)
	}
	if ae.Code == api.CodeInternal {
		return e.internal(ae.RequestID)
	}
	ae.Message = e.Scrub(ae.Message)
	return ae
}

// Scrub cuts the host's directories out of a message a client will see,
// and bounds its length (a backstop for inputs quoted without
// errdefs.Clip).
func (e *Edge) Scrub(msg string) string {
	for _, dir := range e.or().scrub {
		if len(dir) > 1 {
			msg = strings.ReplaceAll(msg, dir, "…")
		}
	}
	return errdefs.ClipMessage(msg, maxMessage)
}

// internal is the generic error a client gets for an unclassified one.
func (e *Edge) internal(requestID string) *api.Error {
	msg := "internal error; the server log has details"
	if requestID != "" {
		msg += " under request id " + requestID
	}
	return &api.Error{Code: api.CodeInternal, Message: msg, RequestID: requestID}
}

// Problem is Public and the HTTP status of err, and logs err: an
// internal error as an error with what the client did not see, others at
// debug level. A body over its limit (errdefs.TooLarge) is 413.
func (e *Edge) Problem(ctx context.Context, err error) (*api.Error, int) {
	e = e.or()
	ae := e.Public(ctx, err)
	log := e.requestLog(ctx)
	switch {
	case errors.Is(err, context.Canceled) && ctx.Err() != nil:
		log.Debug("client went away", "err", err)
	case ae.Code == api.CodeInternal:
		log.Error("internal error", "err", err)
	default:
		log.Debug("request failed", "code", ae.Code, "err", err)
	}
	if _, ok := errors.AsType[*errdefs.TooLarge](err); ok {
		return ae, http.StatusRequestEntityTooLarge
	}
	return ae, ae.Code.HTTPStatus()
}

// Internal logs err as an internal error of the request of ctx and
// returns the generic error the client gets instead: for errors a
// protocol already marked internal (envd's Connect errors).
func (e *Edge) Internal(ctx context.Context, err error) *api.Error {
	e = e.or()
	e.requestLog(ctx).Error("internal error", "err", err)
	return e.internal(RequestID(ctx))
}

func (e *Edge) requestLog(ctx context.Context) *slog.Logger {
	ri := infoOf(ctx)
	if ri == nil {
		return e.log
	}
	return e.log.With("request_id", ri.id, "method", ri.method, "path", ri.path)
}

// ObserveCreate records how long a sandbox create took and how it ended.
func (e *Edge) ObserveCreate(d time.Duration, err error) {
	e.or().metrics.ObserveCreate(d, CodeLabel(err))
}
