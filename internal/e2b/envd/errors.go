package envd

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"connectrpc.com/connect"

	"github.com/kiln-sh/kiln/internal/agentapi/channel"
	"github.com/kiln-sh/kiln/internal/errdefs"
)

// classes maps Kiln's error classes to Connect codes, as envd answers them.
var classes = []struct {
	class  error
	code   connect.Code
	status int // for the plain-HTTP endpoints
}{
	{errdefs.ErrNotFound, connect.CodeNotFound, http.StatusNotFound},
	{errdefs.ErrAlreadyExists, connect.CodeAlreadyExists, http.StatusConflict},
	{errdefs.ErrInvalidArgument, connect.CodeInvalidArgument, http.StatusBadRequest},
	{errdefs.ErrFailedPrecondition, connect.CodeFailedPrecondition, http.StatusBadRequest},
	{errdefs.ErrResourceExhausted, connect.CodeResourceExhausted, http.StatusInsufficientStorage},
	{errdefs.ErrUnauthenticated, connect.CodeUnauthenticated, http.StatusUnauthorized},
	{errdefs.ErrPermissionDenied, connect.CodePermissionDenied, http.StatusForbidden},
	{errdefs.ErrUnavailable, connect.CodeUnavailable, http.StatusBadGateway},
	{errdefs.ErrDeadlineExceeded, connect.CodeDeadlineExceeded, http.StatusGatewayTimeout},
}

// rpcError turns an error from the agent (wrapped in an errdefs class)
// into a Connect error whose message is the agent's, without the class.
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
	for _, c := range classes {
		if errors.Is(err, c.class) {
			return connect.NewError(c.code, errors.New(message(err, c.class)))
		}
	}
	return connect.NewError(connect.CodeInternal, errors.New(errdefs.ClipMessage(err.Error(), maxErrorMessage)))
}

// maxErrorMessage bounds an error message a client gets: a backstop for
// the inputs the messages quote (each clipped by errdefs.Clip).
const maxErrorMessage = 1024

// message is err's text without the ": <class>" that wrapping added,
// at most maxErrorMessage bytes.
func message(err, class error) string {
	return errdefs.ClipMessage(strings.TrimSuffix(err.Error(), ": "+class.Error()), maxErrorMessage)
}

// httpStatus is the status of err on envd's plain-HTTP endpoints.
func httpStatus(err error) (int, string) {
	for _, c := range classes {
		if errors.Is(err, c.class) {
			return c.status, message(err, c.class)
		}
	}
	return http.StatusInternalServerError, errdefs.ClipMessage(err.Error(), maxErrorMessage)
}

// is reports whether err is a Connect error with code.
func is(err error, code connect.Code) bool {
	return connect.CodeOf(err) == code
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
