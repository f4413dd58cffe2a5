package client

import (
	"context"
	"net/http"

	"github.com/kiln-sh/kiln/api"
)

// Pause pauses a running sandbox and returns it. On runsc its memory,
// processes and files are saved to disk and nothing of it keeps running;
// on runc it is frozen. Its timeout stops; it lives until it is resumed or
// killed, or until the server's maximum paused lifetime (7 days by
// default) has passed.
func (c *Client) Pause(ctx context.Context, id string) (*api.Sandbox, error) {
	var sb api.Sandbox
	if err := c.call(ctx, http.MethodPost, sandboxPath(id, "pause"), nil, nil, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Resume resumes a paused sandbox, with its processes, memory and files as
// they were, and returns it; its timeout starts over. A sandbox created
// with AutoPause is also resumed by any command, file or code call.
func (c *Client) Resume(ctx context.Context, id string) (*api.Sandbox, error) {
	var sb api.Sandbox
	if err := c.call(ctx, http.MethodPost, sandboxPath(id, "resume"), nil, nil, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Fork makes count (1-16) new sandboxes that continue from a running runsc
// sandbox's current memory, processes and files, and then diverge
// independently; the source keeps running. Either all forks are made or
// none.
func (c *Client) Fork(ctx context.Context, id string, count int) ([]api.Sandbox, error) {
	var resp api.ForkResponse
	if err := c.call(ctx, http.MethodPost, sandboxPath(id, "fork"), nil, api.ForkRequest{Count: count}, &resp); err != nil {
		return nil, err
	}
	return resp.Sandboxes, nil
}
