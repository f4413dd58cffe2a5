package client

import (
	"bytes"
	"context"
	"net/http"
	"net/url"
	"strconv"

	"github.com/kiln-sh/kiln/api"
)

func commandPath(id string, pid int, elem ...string) string {
	return sandboxPath(id, append([]string{"commands", strconv.Itoa(pid)}, elem...)...)
}

// Run runs a command in a sandbox and streams its output to opts until it
// exits; it returns the command's pid and exit status. A non-zero exit code
// is not an error: check Result.Exit.
//
// If the stream ends before the exit event (the connection dropped, or ctx
// was cancelled) the error is a *[DroppedError] naming the pid and the last
// seq received; the command keeps running and [Client.Attach] resumes its
// output from there. An error event from the server ends the stream the
// same way, with the *[Error] inside the *[DroppedError].
// req.Background is ignored (use [Client.Start]).
func (c *Client) Run(ctx context.Context, id string, req api.CommandRequest, opts RunOptions) (Result, error) {
	req.Background = false
	resp, err := c.send(ctx, request{method: http.MethodPost, path: sandboxPath(id, "commands"), json: req, accept: ndjson})
	if err != nil {
		return Result{}, err
	}
	defer drain(resp.Body)
	return commandEvents(ctx, resp.Body, 0, opts)
}

// Output runs a command and returns its collected output once it exits
// (the server buffers it, up to req.OutputLimit). Prefer [Client.Run] for
// long or chatty commands.
func (c *Client) Output(ctx context.Context, id string, req api.CommandRequest) (*api.CommandResult, error) {
	req.Background = false
	var res api.CommandResult
	if err := c.call(ctx, http.MethodPost, sandboxPath(id, "commands"), nil, req, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// Start starts a command in the background and returns its pid at once.
// Follow its output with [Client.Attach]; feed it with [Client.SendStdin]
// (set req.Stdin to keep its stdin open).
func (c *Client) Start(ctx context.Context, id string, req api.CommandRequest) (int, error) {
	req.Background = true
	var st api.CommandStarted
	if err := c.call(ctx, http.MethodPost, sandboxPath(id, "commands"), nil, req, &st); err != nil {
		return 0, err
	}
	return st.PID, nil
}

// Attach streams a command's events with seq greater than afterSeq (0 for
// all that are still buffered), then live ones, until it exits. It returns
// like [Client.Run]; attaching to a command that already exited replays its
// events and returns its exit status.
func (c *Client) Attach(ctx context.Context, id string, pid int, afterSeq uint64, opts RunOptions) (Result, error) {
	q := url.Values{}
	if afterSeq > 0 {
		q.Set("after_seq", strconv.FormatUint(afterSeq, 10))
	}
	resp, err := c.send(ctx, request{method: http.MethodGet, path: commandPath(id, pid, "events"), query: q, accept: ndjson})
	if err != nil {
		return Result{PID: pid}, err
	}
	defer drain(resp.Body)
	return commandEvents(ctx, resp.Body, pid, opts)
}

// Processes lists the commands started in a sandbox, running or ended.
func (c *Client) Processes(ctx context.Context, id string) ([]api.ProcessInfo, error) {
	var ps []api.ProcessInfo
	if err := c.call(ctx, http.MethodGet, sandboxPath(id, "commands"), nil, nil, &ps); err != nil {
		return nil, err
	}
	return ps, nil
}

// SendStdin writes data to a command's standard input (it must have been
// started with Stdin or a PTY), then closes its stdin if close is set.
func (c *Client) SendStdin(ctx context.Context, id string, pid int, data []byte, close bool) error {
	q := url.Values{}
	if close {
		q.Set("close", "true")
	}
	resp, err := c.send(ctx, request{
		method: http.MethodPost, path: commandPath(id, pid, "stdin"), query: q,
		body: bytes.NewReader(data), ctype: "application/octet-stream",
	})
	if err != nil {
		return err
	}
	drain(resp.Body)
	return nil
}

// Signal sends a signal such as "SIGTERM" or "SIGKILL" to a command's
// process group.
func (c *Client) Signal(ctx context.Context, id string, pid int, signal string) error {
	return c.call(ctx, http.MethodPost, commandPath(id, pid, "signal"), nil, api.SignalRequest{Signal: signal}, nil)
}

// Resize sets the terminal size of a command started with a PTY.
func (c *Client) Resize(ctx context.Context, id string, pid int, size api.PTYSize) error {
	return c.call(ctx, http.MethodPost, commandPath(id, pid, "resize"), nil, size, nil)
}
