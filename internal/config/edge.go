package config

import (
	"errors"
	"os"
	"strconv"
	"time"
)

// Edge bounds what clients may hold of kiln serve's HTTP server before
// and while they authenticate. Zero fields take the defaults.
type Edge struct {
	// BodyTimeout is the request bodies' progress deadline
	// (KILN_BODY_TIMEOUT, default 30s): a body must deliver at least
	// BodyProgressBytes per BodyTimeout (a stream, such as a command's
	// stdin or an exposed port's upload, at least one byte), else the
	// request ends with 408. It is no cap on a body's total time.
	BodyTimeout time.Duration
	// MaxAnonymous caps the requests served without any credential at
	// once (health checks, public ports; KILN_MAX_ANONYMOUS, default
	// 256); more are answered 429.
	MaxAnonymous int
	// MaxPendingConns caps the connections that have never carried an
	// authenticated request and are between requests (sending a request
	// header, or idle; KILN_MAX_PENDING_CONNS, default 1024); beyond it
	// the oldest is closed.
	MaxPendingConns int
}

// BodyProgressBytes is how much a (non-stream) request body must deliver
// per Edge.BodyTimeout.
const BodyProgressBytes = 32 << 10

// WithDefaults returns e with its zero fields defaulted.
func (e Edge) WithDefaults() Edge {
	if e.BodyTimeout == 0 {
		e.BodyTimeout = 30 * time.Second
	}
	if e.MaxAnonymous == 0 {
		e.MaxAnonymous = 256
	}
	if e.MaxPendingConns == 0 {
		e.MaxPendingConns = 1024
	}
	return e
}

// edgeFromEnv overrides e by KILN_BODY_TIMEOUT, KILN_MAX_ANONYMOUS and
// KILN_MAX_PENDING_CONNS; malformed values become -1 for validate.
func edgeFromEnv(e Edge) Edge {
	if v := os.Getenv("KILN_BODY_TIMEOUT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			d = -1
		}
		e.BodyTimeout = d
	}
	for _, f := range []struct {
		key string
		dst *int
	}{{"KILN_MAX_ANONYMOUS", &e.MaxAnonymous}, {"KILN_MAX_PENDING_CONNS", &e.MaxPendingConns}} {
		if v := os.Getenv(f.key); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				n = -1
			}
			*f.dst = n
		}
	}
	return e
}

func (e Edge) validate() error {
	var errs []error
	if e.BodyTimeout < 0 {
		errs = append(errs, errors.New("body timeout (KILN_BODY_TIMEOUT) must be a positive duration such as 30s"))
	}
	if e.MaxAnonymous < 0 || e.MaxPendingConns < 0 {
		errs = append(errs, errors.New("KILN_MAX_ANONYMOUS and KILN_MAX_PENDING_CONNS must be positive numbers"))
	}
	return errors.Join(errs...)
}
