package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/kiln-sh/kiln/api"
)

// MaxEventSize bounds one line of an NDJSON stream; a longer line ends the
// stream with an error rather than growing memory without limit.
const MaxEventSize = 8 << 20

// ndjson is the media type of event streams.
const ndjson = "application/x-ndjson"

// errStop is returned by a stream callback to end the stream cleanly.
var errStop = errors.New("stop")

// DroppedError reports a command stream that ended before the command's
// exit event: the connection dropped, ctx was cancelled, or the server
// ended the stream with an error event (e.g. unavailable while it shuts
// down; Err is then a *Error). The command keeps running in its sandbox
// unless the sandbox is gone; resume its output with
// Attach(ctx, id, e.PID, e.LastSeq, ...).
type DroppedError struct {
	PID     int    // the command's pid, 0 if not yet known
	LastSeq uint64 // seq of the last event received, 0 if none
	Err     error  // why: io.ErrUnexpectedEOF, a network error, ctx.Err() or *Error
}

func (e *DroppedError) Error() string {
	what := "connection dropped"
	if _, ok := e.Err.(*Error); ok {
		what = "server ended the stream"
	}
	return fmt.Sprintf("%s before the command exited (pid %d, last event seq %d; re-attach after seq %d): %v",
		what, e.PID, e.LastSeq, e.LastSeq, e.Err)
}

func (e *DroppedError) Unwrap() error { return e.Err }

// readEvents calls fn for every event of an NDJSON stream except pings,
// until the stream ends (nil), fn returns errStop (nil) or another error
// (that error), or reading fails. It returns the last seq seen.
func readEvents(ctx context.Context, body io.Reader, fn func(api.Event) error) (last uint64, err error) {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 0, 64<<10), MaxEventSize)
	sc.Split(splitLines)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 {
			continue
		}
		var ev api.Event
		if err := json.Unmarshal(line, &ev); err != nil {
			return last, &formatError{fmt.Errorf("decoding stream event after seq %d: %w", last, err)}
		}
		if ev.Type == api.EventPing {
			continue
		}
		if ev.Seq > last {
			last = ev.Seq
		}
		if err := fn(ev); err != nil {
			if err == errStop {
				return last, nil
			}
			return last, err
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return last, &formatError{fmt.Errorf("reading stream after seq %d: event longer than %d bytes", last, MaxEventSize)}
		}
		if ctx.Err() != nil {
			return last, ctx.Err()
		}
		return last, err
	}
	return last, io.EOF
}

// Result is how a streamed command ended.
type Result struct {
	PID     int
	Exit    api.ExitStatus
	LastSeq uint64 // seq of the exit event
}

// RunOptions receives a command's output as it streams. Callbacks run on
// the calling goroutine, in stream order; a slow callback slows the stream
// (the server buffers, then applies backpressure). Any may be nil.
type RunOptions struct {
	OnStdout func([]byte)    // each chunk of standard output
	OnStderr func([]byte)    // each chunk of standard error
	OnEvent  func(api.Event) // every event (start, stdout, stderr, exit), pings excluded
}

// commandEvents reads a command's event stream until its exit event.
func commandEvents(ctx context.Context, body io.Reader, pid int, opts RunOptions) (Result, error) {
	res := Result{PID: pid}
	var exited bool
	var streamErr error
	last, err := readEvents(ctx, body, func(ev api.Event) error {
		if ev.PID != 0 {
			res.PID = ev.PID
		}
		if opts.OnEvent != nil {
			opts.OnEvent(ev)
		}
		switch ev.Type {
		case api.EventStdout:
			if opts.OnStdout != nil {
				opts.OnStdout(ev.Data)
			}
		case api.EventStderr:
			if opts.OnStderr != nil {
				opts.OnStderr(ev.Data)
			}
		case api.EventExit:
			if ev.Exit != nil {
				res.Exit = *ev.Exit
			}
			res.LastSeq, exited = ev.Seq, true
			return errStop
		case api.EventError:
			streamErr = streamError(ev, "stream ended with an error")
			return errStop
		}
		return nil
	})
	switch {
	case exited:
		return res, nil
	case streamErr != nil:
		err = streamErr
	case err == io.EOF:
		err = io.ErrUnexpectedEOF
	case errors.As(err, new(*formatError)):
		return res, err
	}
	return res, &DroppedError{PID: res.PID, LastSeq: last, Err: err}
}

// formatError is a stream the client cannot read; re-attaching would not
// help.
type formatError struct{ error }

func (e *formatError) Unwrap() error { return e.error }

// splitLines splits NDJSON lines like bufio.ScanLines, but reports a last
// line without its newline as io.ErrUnexpectedEOF: the stream was cut.
func splitLines(data []byte, atEOF bool) (int, []byte, error) {
	if i := bytes.IndexByte(data, '\n'); i >= 0 {
		return i + 1, bytes.TrimSuffix(data[:i], []byte{'\r'}), nil
	}
	if atEOF && len(data) > 0 {
		return 0, nil, io.ErrUnexpectedEOF
	}
	return 0, nil, nil
}

// streamError converts an error event into *Error.
func streamError(ev api.Event, fallback string) *Error {
	if ev.Error == nil {
		return &Error{Code: api.CodeInternal, Message: fallback}
	}
	return apiError(0, *ev.Error)
}
