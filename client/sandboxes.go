package client

import (
	"context"
	"fmt"
	"iter"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/kiln-sh/kiln/api"
)

// CreateSandbox creates a sandbox and returns it once it is running.
// Zero fields of req take the server's defaults (template "base", runtime
// runsc, a 300 s timeout).
func (c *Client) CreateSandbox(ctx context.Context, req api.CreateSandboxRequest) (*api.Sandbox, error) {
	var sb api.Sandbox
	if err := c.call(ctx, http.MethodPost, "/v1/sandboxes", nil, req, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// GetSandbox returns a sandbox, including stopped and failed ones (with
// their Reason).
func (c *Client) GetSandbox(ctx context.Context, id string) (*api.Sandbox, error) {
	var sb api.Sandbox
	if err := c.call(ctx, http.MethodGet, sandboxPath(id), nil, nil, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// ListFilter selects sandboxes for [Client.ListSandboxes]. Zero fields
// select everything.
type ListFilter struct {
	States    []string          // any of these states (creating, running, paused, ...)
	Metadata  map[string]string // all of these metadata pairs
	Limit     int               // page size; 0 means the server's default
	PageToken string            // from a previous page's NextPageToken
}

func (f ListFilter) query() url.Values {
	q := url.Values{}
	for _, s := range f.States {
		q.Add("state", s)
	}
	for k, v := range f.Metadata {
		q.Add("metadata."+k, v)
	}
	if f.Limit > 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	if f.PageToken != "" {
		q.Set("page_token", f.PageToken)
	}
	return q
}

// ListSandboxes returns one page of the caller's sandboxes. Pass the
// answer's NextPageToken as f.PageToken to get the next page, or use
// [Client.AllSandboxes].
func (c *Client) ListSandboxes(ctx context.Context, f ListFilter) (*api.SandboxList, error) {
	var l api.SandboxList
	if err := c.call(ctx, http.MethodGet, "/v1/sandboxes", f.query(), nil, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// AllSandboxes iterates over every sandbox f selects, fetching pages as
// needed (f.PageToken is where it starts). An error is yielded once, as the
// last item:
//
//	for sb, err := range c.AllSandboxes(ctx, client.ListFilter{States: []string{"running"}}) {
//		if err != nil {
//			return err
//		}
//		fmt.Println(sb.ID)
//	}
func (c *Client) AllSandboxes(ctx context.Context, f ListFilter) iter.Seq2[api.Sandbox, error] {
	return func(yield func(api.Sandbox, error) bool) {
		for {
			page, err := c.ListSandboxes(ctx, f)
			if err != nil {
				yield(api.Sandbox{}, err)
				return
			}
			for _, sb := range page.Sandboxes {
				if !yield(sb, nil) {
					return
				}
			}
			if page.NextPageToken == "" {
				return
			}
			if page.NextPageToken == f.PageToken {
				yield(api.Sandbox{}, fmt.Errorf("listing sandboxes: server repeated page token %q", f.PageToken))
				return
			}
			f.PageToken = page.NextPageToken
		}
	}
}

// KillSandbox destroys a sandbox and everything in it.
func (c *Client) KillSandbox(ctx context.Context, id string) error {
	return c.call(ctx, http.MethodDelete, sandboxPath(id), nil, nil, nil)
}

// SetTimeout sets how long from now the sandbox lives before it is killed
// (rounded up to whole seconds) and returns it with its new ExpiresAt.
func (c *Client) SetTimeout(ctx context.Context, id string, d time.Duration) (*api.Sandbox, error) {
	req := api.TimeoutRequest{Timeout: int64(math.Ceil(d.Seconds()))}
	var sb api.Sandbox
	if err := c.call(ctx, http.MethodPost, sandboxPath(id, "timeout"), nil, req, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Usage returns a sandbox's current CPU, memory, disk and process use.
func (c *Client) Usage(ctx context.Context, id string) (*api.Usage, error) {
	var u api.Usage
	if err := c.call(ctx, http.MethodGet, sandboxPath(id, "usage"), nil, nil, &u); err != nil {
		return nil, err
	}
	return &u, nil
}
