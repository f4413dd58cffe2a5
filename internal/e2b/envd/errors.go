package envd

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"connectrpc.com/connect"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/channel"
	"github.com/kiln-sh/kiln/internal/edge"
	"github.com/kiln-sh/kiln/internal/errdefs"
)

// envd answers with the error classes of the edge (errdefs' table): a
// Connect error's code is its class's API code by name (Connect's codes
// are gRPC's, as api's are), and the plain-HTTP endpoints answer the
// API's status except where envd's own differ (plainStatus). The message
// is the error's without the ": <class>" that wrapping added. An
// unclassified error stays in the log: the client gets the edge's generic
// message with the request id (scrub, httpError).

// rpcError turns an error from the agent (wrapped in an errdefs class)
// into a Connect error whose message is the agent's, without the class.
// An unclassified one becomes an internal error that still wraps err, for
// scrub to log and replace.
func rpcError(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	switch {
	case errors.Is(err, context.Canceled):
		return connect.NewError(connect.CodeCanceled, err)
	case errors.Is(err, context.DeadlineExceeded):
		return connect.NewError(connect.CodeDeadlineExceeded, err)
	}
	class := errdefs.ClassOf(err)
	if class == nil {
		return connect.NewError(connect.CodeInternal, err)
	}
	return connect.NewError(connectCode(errdefs.Code(err)), errors.New(message(err, class)))
}

// connectCode is the Connect code named as the API code c.
func connectCode(c api.ErrorCode) connect.Code {
	var code connect.Code
	if code.UnmarshalText([]byte(c)) != nil {
		return connect.CodeInternal
	}
	return code
}

// maxErrorMessage bounds an error message a client gets: a backstop for
// the inputs the messages quote (each clipped by errdefs.Clip).
const maxErrorMessage = 1024

// message is err's text without the ": <class>" that wrapping added,
// at most maxErrorMessage bytes.
func message(err, class error) string {
	msg := err.Error()
	if class != nil {
		msg = strings.TrimSuffix(msg, ": "+class.Error())
	}
	return errdefs.ClipMessage(msg, maxErrorMessage)
}

// plainStatus is the status of an API code on envd's plain-HTTP
// endpoints: the API's, but for envd's own 400 for a failed
// precondition, 507 for exhausted resources (a full disk) and 502 for an
// unavailable sandbox.
func plainStatus(c api.ErrorCode) int {
	switch c {
	case api.CodeFailedPrecondition:
		return http.StatusBadRequest
	case api.CodeResourceExhausted:
		return http.StatusInsufficientStorage
	case api.CodeUnavailable:
		return http.StatusBadGateway
	}
	return c.HTTPStatus()
}

// httpError is the status and message of err on envd's plain-HTTP
// endpoints.
func (t *target) httpError(ctx context.Context, err error) (int, string) {
	class := errdefs.ClassOf(err)
	if class == nil {
		return http.StatusInternalServerError, t.edge.Internal(ctx, err).Message
	}
	return plainStatus(errdefs.Code(err)), t.edge.Scrub(message(err, class))
}

// scrub applies the edge's rules to envd's Connect errors: an internal
// (or unknown) error's text goes to the log and the client gets the
// generic message with the request id; other messages name no host
// directory.
type scrub struct{ edge *edge.Edge }

func (s scrub) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		res, err := next(ctx, req)
		return res, s.error(ctx, err)
	}
}

func (s scrub) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (s scrub) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		return s.error(ctx, next(ctx, conn))
	}
}

func (s scrub) error(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	code := connect.CodeOf(err)
	ce, ok := errors.AsType[*connect.Error](err)
	switch {
	case code == connect.CodeInternal || code == connect.CodeUnknown:
		if ok && ce.Unwrap() != nil {
			err = ce.Unwrap()
		}
		return connect.NewError(code, errors.New(s.edge.Internal(ctx, err).Message))
	case ok:
		if msg := s.edge.Scrub(ce.Message()); msg != ce.Message() {
			return connect.NewError(code, errors.New(msg))
		}
	}
	return err
}

func rpcErrorf(code connect.Code, format string, args ...any) error {
	return connect.NewError(code, errors.New(errdefs.ClipMessage(fmt.Sprintf(format, args...), maxErrorMessage)))
}

// sandboxGone reports whether err means the sandbox's agent went away
// (the sandbox was killed or paused) mid-request.
func sandboxGone(err error) bool {
	return errors.Is(err, channel.ErrSessionClosed)
}

// abortIfGone tears the connection down when the sandbox died during a
// stream, as E2B's proxy does: the SDKs then probe /health, get 502 and
// report that the sandbox was killed, rather than a clean end of stream.
func abortIfGone(err error) {
	if sandboxGone(err) {
		panic(http.ErrAbortHandler)
	}
}
