package api

// ErrorCodes returns every error code, in the order they are declared.
func ErrorCodes() []ErrorCode {
	return []ErrorCode{
		CodeInvalidArgument, CodeNotFound, CodeAlreadyExists, CodeFailedPrecondition, CodeResourceExhausted,
		CodeUnauthenticated, CodePermissionDenied, CodeUnavailable, CodeDeadlineExceeded, CodeInternal,
	}
}

// HTTPStatus is the HTTP status the API answers an error of code c with:
// the one table of them, which the server applies and the SDK reads back.
// Unknown codes are internal (500). The numbers are literal so that api,
// which the in-sandbox agent imports, stays free of net/http.
func (c ErrorCode) HTTPStatus() int {
	switch c {
	case CodeInvalidArgument:
		return 400 // Bad Request
	case CodeUnauthenticated:
		return 401 // Unauthorized
	case CodePermissionDenied:
		return 403 // Forbidden
	case CodeNotFound:
		return 404 // Not Found
	case CodeAlreadyExists, CodeFailedPrecondition:
		return 409 // Conflict
	case CodeResourceExhausted:
		return 429 // Too Many Requests
	case CodeUnavailable:
		return 503 // Service Unavailable
	case CodeDeadlineExceeded:
		return 504 // Gateway Timeout
	}
	return 500 // Internal Server Error
}
