package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/kiln-sh/kiln/api"
)

// Error is a failed API call: the server's api.Error body and the HTTP
// status it came with. Status is 0 when the error arrived as an `error`
// event inside a stream (after a 200). See the package documentation for
// what each status means. errors.As(err, &apiErr) with apiErr *api.Error
// also works.
type Error struct {
	Status    int // HTTP status
	Code      api.ErrorCode
	Message   string
	RequestID string // the server's X-Request-Id: quote it in bug reports
}

// apiError converts an api.Error into *Error.
func apiError(status int, e api.Error) *Error {
	return &Error{Status: status, Code: e.Code, Message: e.Message, RequestID: e.RequestID}
}

func (e *Error) Error() string {
	s := string(e.Code) + ": " + e.Message
	if e.Status != 0 {
		s = fmt.Sprintf("%s (HTTP %d", s, e.Status)
		if e.RequestID != "" {
			s += ", request " + e.RequestID
		}
		s += ")"
	}
	return s
}

// Unwrap returns the error as the wire type *api.Error.
func (e *Error) Unwrap() error {
	return &api.Error{Code: e.Code, Message: e.Message, RequestID: e.RequestID}
}

// IsCode reports whether err is an API error with the given code, e.g.
// IsCode(err, api.CodeNotFound).
func IsCode(err error, code api.ErrorCode) bool {
	var ae *api.Error
	return errors.As(err, &ae) && ae.Code == code
}

// maxErrorBody bounds how much of an error answer is read.
const maxErrorBody = 64 << 10

// decodeError turns a non-2xx response into *Error. A body that is not an
// api.Error (e.g. a proxy's HTML page) still yields one, with the code
// guessed from the status and the start of the body as the message.
func decodeError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	var body api.Error
	if err := json.Unmarshal(b, &body); err != nil || body.Code == "" {
		msg := strings.TrimSpace(string(b))
		if len(msg) > 200 {
			msg = msg[:200] + "…"
		}
		if msg == "" {
			msg = http.StatusText(resp.StatusCode)
		}
		body = api.Error{Code: codeFor(resp.StatusCode), Message: msg}
	}
	e := apiError(resp.StatusCode, body)
	if e.RequestID == "" {
		e.RequestID = resp.Header.Get("X-Request-Id")
	}
	return e
}

// codeFor guesses the error code of a status that came without a body:
// the code the API answers with that status (api.ErrorCode.HTTPStatus;
// of already_exists and failed_precondition, which share 409, the
// latter), and for statuses proxies and net/http send, their nearest.
func codeFor(status int) api.ErrorCode {
	switch status {
	case http.StatusConflict:
		return api.CodeFailedPrecondition
	case http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType, http.StatusMethodNotAllowed:
		return api.CodeInvalidArgument
	case http.StatusBadGateway:
		return api.CodeUnavailable
	}
	for _, c := range api.ErrorCodes() {
		if c.HTTPStatus() == status {
			return c
		}
	}
	return api.CodeInternal
}
