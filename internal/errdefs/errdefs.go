// Package errdefs defines the small closed set of error classes that Kiln's
// host-side packages wrap their errors in. Each class has one API code
// (Code and Class, codes.go: the one table), and each code one HTTP status
// (api.ErrorCode.HTTPStatus); everything else uses errors.Is.
package errdefs

import "errors"

var (
	ErrNotFound           = errors.New("not found")
	ErrAlreadyExists      = errors.New("already exists")
	ErrInvalidArgument    = errors.New("invalid argument")
	ErrFailedPrecondition = errors.New("failed precondition")
	ErrResourceExhausted  = errors.New("resource exhausted")
	ErrUnauthenticated    = errors.New("unauthenticated")
	ErrPermissionDenied   = errors.New("permission denied")
	ErrUnavailable        = errors.New("unavailable")
	ErrDeadlineExceeded   = errors.New("deadline exceeded")
)
