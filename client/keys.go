package client

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/kiln-sh/kiln/api"
)

// CreateKey creates an API key (admin keys only). The answer's Secret is the
// key itself; the server never shows it again.
func (c *Client) CreateKey(ctx context.Context, req api.CreateKeyRequest) (*api.APIKey, error) {
	var k api.APIKey
	if err := c.call(ctx, http.MethodPost, "/v1/keys", nil, req, &k); err != nil {
		return nil, err
	}
	return &k, nil
}

// ListKeys lists the API keys, revoked ones included, without their secrets
// (admin keys only).
func (c *Client) ListKeys(ctx context.Context) ([]api.APIKey, error) {
	var ks []api.APIKey
	if err := c.call(ctx, http.MethodGet, "/v1/keys", nil, nil, &ks); err != nil {
		return nil, err
	}
	return ks, nil
}

// RevokeKey revokes an API key by its ID (admin keys only); requests made
// with it fail with 401 from then on.
func (c *Client) RevokeKey(ctx context.Context, id string) error {
	return c.call(ctx, http.MethodDelete, "/v1/keys/"+url.PathEscape(id), nil, nil, nil)
}

// Health reports whether the server is up, and its version. It needs no
// API key.
func (c *Client) Health(ctx context.Context) (*api.Health, error) {
	var h api.Health
	if err := c.call(ctx, http.MethodGet, "/healthz", nil, nil, &h); err != nil {
		return nil, err
	}
	return &h, nil
}

// Nodes lists the cluster's nodes as its catalog knows them (admin keys
// only; none on a server outside a cluster).
func (c *Client) Nodes(ctx context.Context) ([]api.ClusterNode, error) {
	var l api.ClusterNodeList
	if err := c.call(ctx, http.MethodGet, "/v1/nodes", nil, nil, &l); err != nil {
		return nil, err
	}
	return l.Nodes, nil
}

// Metrics copies the server's Prometheus metrics (text exposition format)
// to w.
func (c *Client) Metrics(ctx context.Context, w io.Writer) error {
	resp, err := c.send(ctx, request{method: http.MethodGet, path: "/metrics", accept: "text/plain"})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(w, resp.Body); err != nil {
		return fmt.Errorf("reading metrics: %w", err)
	}
	return nil
}
