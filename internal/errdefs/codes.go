package errdefs

import (
	"context"
	"errors"

	"github.com/kiln-sh/kiln/api"
)

// classes pairs each error class with its API code, most specific first:
// the one table of them. An error in no class is internal.
var classes = []struct {
	class error
	code  api.ErrorCode
}{
	{ErrInvalidArgument, api.CodeInvalidArgument},
	{ErrUnauthenticated, api.CodeUnauthenticated},
	{ErrPermissionDenied, api.CodePermissionDenied},
	{ErrNotFound, api.CodeNotFound},
	{ErrAlreadyExists, api.CodeAlreadyExists},
	{ErrFailedPrecondition, api.CodeFailedPrecondition},
	{ErrResourceExhausted, api.CodeResourceExhausted},
	{ErrUnavailable, api.CodeUnavailable},
	{ErrDeadlineExceeded, api.CodeDeadlineExceeded},
	{context.DeadlineExceeded, api.CodeDeadlineExceeded},
}

// ClassOf returns the class err is in (one of the Err* values, or
// context.DeadlineExceeded), or nil for an unclassified error.
func ClassOf(err error) error {
	for _, c := range classes {
		if errors.Is(err, c.class) {
			return c.class
		}
	}
	return nil
}

// Code is the API code of err's class; api.CodeInternal if it has none.
func Code(err error) api.ErrorCode {
	for _, c := range classes {
		if errors.Is(err, c.class) {
			return c.code
		}
	}
	return api.CodeInternal
}

// Class is the error class of an API code (an error the agent sent); nil
// for api.CodeInternal and codes it does not know.
func Class(code api.ErrorCode) error {
	for _, c := range classes {
		if c.code == code {
			return c.class
		}
	}
	return nil
}
