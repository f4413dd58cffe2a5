package client

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
)

// maxScreenshot bounds the screenshot Screenshot reads: the server's
// limit, with room to spare.
const maxScreenshot = 40 << 20

// Screenshot returns a PNG of the sandbox's X screen: display ("" for
// :0, the desktop template's). A sandbox without a desktop up is an
// *Error with code failed_precondition.
func (c *Client) Screenshot(ctx context.Context, id, display string) ([]byte, error) {
	var q url.Values
	if display != "" {
		q = url.Values{"display": {display}}
	}
	resp, err := c.send(ctx, request{method: http.MethodGet, path: sandboxPath(id, "screenshot"), query: q, accept: "image/png"})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxScreenshot+1))
	switch {
	case err != nil:
		return nil, fmt.Errorf("reading screenshot: %w", err)
	case len(b) > maxScreenshot:
		return nil, fmt.Errorf("screenshot larger than %d bytes", maxScreenshot)
	}
	return b, nil
}
