package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/kiln-sh/kiln/api"
)

// CodeOptions receives an execution's output as it streams. Callbacks run
// on the calling goroutine, in stream order; any may be nil.
type CodeOptions struct {
	OnStdout func([]byte)             // each chunk of standard output
	OnStderr func([]byte)             // each chunk of standard error
	OnResult func(api.Result)         // each rich output (display(), figures, the cell's value)
	OnError  func(api.ExecutionError) // the exception the code raised
	OnEvent  func(api.Event)          // every event, pings excluded
}

// RunCode runs code in a sandbox's interpreter context (req.ContextID, or
// the default context of req.Language) and streams its output to opts
// until the execution ends; it also returns everything collected. An
// exception in the code is not an error: it is in CodeResult.Error (and
// passed to opts.OnError). Variables persist between calls in the same
// context. If the stream breaks or the server ends it with an error event
// (then the error is an *[Error]), RunCode returns what arrived so far with
// the error; the execution was interrupted.
func (c *Client) RunCode(ctx context.Context, id string, req api.CodeRequest, opts CodeOptions) (*api.CodeResult, error) {
	resp, err := c.send(ctx, request{method: http.MethodPost, path: sandboxPath(id, "code"), json: req, accept: ndjson})
	if err != nil {
		return nil, err
	}
	defer drain(resp.Body)
	return codeEvents(ctx, resp.Body, opts)
}

// RunCodeJSON runs code and returns its collected output once the
// execution ended (the server buffers it, up to 64 MiB). Prefer
// [Client.RunCode] for long or chatty code.
func (c *Client) RunCodeJSON(ctx context.Context, id string, req api.CodeRequest) (*api.CodeResult, error) {
	var res api.CodeResult
	if err := c.call(ctx, http.MethodPost, sandboxPath(id, "code"), nil, req, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// codeEvents reads an execution's event stream until its done event.
func codeEvents(ctx context.Context, body io.Reader, opts CodeOptions) (*api.CodeResult, error) {
	res := &api.CodeResult{Results: []api.Result{}}
	var stdout, stderr strings.Builder
	var done bool
	var streamErr error
	_, err := readEvents(ctx, body, func(ev api.Event) error {
		if opts.OnEvent != nil {
			opts.OnEvent(ev)
		}
		switch ev.Type {
		case api.EventStdout:
			stdout.Write(ev.Data)
			if opts.OnStdout != nil {
				opts.OnStdout(ev.Data)
			}
		case api.EventStderr:
			stderr.Write(ev.Data)
			if opts.OnStderr != nil {
				opts.OnStderr(ev.Data)
			}
		case api.EventResult:
			if ev.Result != nil {
				res.Results = append(res.Results, *ev.Result)
				if opts.OnResult != nil {
					opts.OnResult(*ev.Result)
				}
			}
		case api.EventExecutionError:
			if ev.ExecutionError != nil {
				res.Error = ev.ExecutionError
				if opts.OnError != nil {
					opts.OnError(*ev.ExecutionError)
				}
			}
		case api.EventDone:
			res.ExecutionCount, done = ev.ExecutionCount, true
			return errStop
		case api.EventError:
			streamErr = streamError(ev, "stream ended with an error")
			return errStop
		}
		return nil
	})
	res.Stdout, res.Stderr = stdout.String(), stderr.String()
	switch {
	case done:
		return res, nil
	case streamErr != nil:
		return res, streamErr
	case err == io.EOF:
		err = io.ErrUnexpectedEOF
	case errors.As(err, new(*formatError)):
		return res, err
	}
	return res, fmt.Errorf("code stream ended before the execution finished: %w", err)
}

func contextPath(id, ctxID string, elem ...string) string {
	return sandboxPath(id, append([]string{"contexts", url.PathEscape(ctxID)}, elem...)...)
}

// CreateContext starts a new interpreter context in a sandbox; run code in
// it with RunCode and api.CodeRequest.ContextID.
func (c *Client) CreateContext(ctx context.Context, id string, req api.CreateContextRequest) (api.Context, error) {
	var out api.Context
	err := c.call(ctx, http.MethodPost, sandboxPath(id, "contexts"), nil, req, &out)
	return out, err
}

// Contexts lists a sandbox's interpreter contexts.
func (c *Client) Contexts(ctx context.Context, id string) ([]api.Context, error) {
	var out []api.Context
	if err := c.call(ctx, http.MethodGet, sandboxPath(id, "contexts"), nil, nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// RestartContext replaces a context's interpreter with a fresh one: its
// state is lost, its id kept.
func (c *Client) RestartContext(ctx context.Context, id, ctxID string) (api.Context, error) {
	var out api.Context
	err := c.call(ctx, http.MethodPost, contextPath(id, ctxID, "restart"), nil, nil, &out)
	return out, err
}

// DeleteContext stops a context's interpreter and forgets the context.
func (c *Client) DeleteContext(ctx context.Context, id, ctxID string) error {
	return c.call(ctx, http.MethodDelete, contextPath(id, ctxID), nil, nil, nil)
}
