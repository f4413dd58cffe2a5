package errdefs

import "fmt"

// TooLarge is a request body over its limit: resource_exhausted, which
// the HTTP edge answers 413 rather than 429 (the client must send less,
// not wait).
type TooLarge struct {
	What  string // e.g. "the upload"
	Limit int64  // bytes
}

func (e *TooLarge) Error() string {
	return fmt.Sprintf("%s is larger than the %d bytes this server allows", e.What, e.Limit)
}

func (e *TooLarge) Unwrap() error { return ErrResourceExhausted }
