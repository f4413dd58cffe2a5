package edge

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/errdefs"
)

// BodyTimeoutError is a request body that made too little progress.
type BodyTimeoutError struct {
	window time.Duration
	stream bool
}

func (e *BodyTimeoutError) Error() string {
	if e.stream {
		return fmt.Sprintf("request body timed out: nothing arrived for %v", e.window)
	}
	return fmt.Sprintf("request body timed out: less than %d KiB arrived in %v", config.BodyProgressBytes>>10, e.window)
}

// Unwrap classifies it; the response is a 408 whatever the handler makes
// of the error (recorder.WriteHeader).
func (e *BodyTimeoutError) Unwrap() error { return errdefs.ErrDeadlineExceeded }

// deadlineBody is a request body with a progress deadline: from its first
// read, at least config.BodyProgressBytes must arrive per window (a
// stream: at least one byte), else reads fail with a BodyTimeoutError. The
// deadline is the connection's read deadline, so a blocked read ends at
// once; it is cleared when the body ends, so that it cannot cut the
// connection while a long response streams.
type deadlineBody struct {
	rc     io.ReadCloser
	ctl    *http.ResponseController
	window time.Duration

	stream   atomic.Bool // SetStreaming: an idle deadline only
	armed    bool        // the reader's own state
	progress int
	finished atomic.Bool // the body ended (EOF, error or timeout)
	eof      atomic.Bool
	timedOut atomic.Bool
}

func newDeadlineBody(rc io.ReadCloser, w http.ResponseWriter, window time.Duration) *deadlineBody {
	return &deadlineBody{rc: rc, ctl: http.NewResponseController(w), window: window}
}

// SetStreaming makes the deadline an idle one: any byte extends it. For
// bodies that are streams a client may feed slowly (a command's stdin, an
// exposed port's upload).
func (b *deadlineBody) SetStreaming() { b.stream.Store(true) }

func (b *deadlineBody) Read(p []byte) (int, error) {
	if b.finished.Load() {
		return b.rc.Read(p)
	}
	if !b.armed {
		b.armed = true
		b.extend()
	}
	n, err := b.rc.Read(p)
	b.progress += n
	if n > 0 && (b.stream.Load() || b.progress >= config.BodyProgressBytes) {
		b.progress = 0
		b.extend()
	}
	switch {
	case err == nil:
	case isTimeout(err):
		b.timedOut.Store(true)
		b.finished.Store(true)
		return n, &BodyTimeoutError{window: b.window, stream: b.stream.Load()}
	default:
		b.finished.Store(true)
		b.eof.Store(errors.Is(err, io.EOF))
		_ = b.ctl.SetReadDeadline(time.Time{})
	}
	return n, err
}

func (b *deadlineBody) Close() error { return b.rc.Close() }

func (b *deadlineBody) extend() { _ = b.ctl.SetReadDeadline(time.Now().Add(b.window)) }

// abandon is called when the handler returned without reading the body
// to its end: net/http would then read up to 256 KiB more of it (however
// slowly it comes) before it closes the connection; the past read
// deadline makes that read fail at once.
func (b *deadlineBody) abandon() {
	b.finished.Store(true)
	_ = b.ctl.SetReadDeadline(time.Now())
}

// unread reports whether the body may still hold data nobody read.
func (b *deadlineBody) unread() bool { return b != nil && !b.eof.Load() }

func isTimeout(err error) bool {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	ne, ok := errors.AsType[net.Error](err)
	return ok && ne.Timeout()
}
