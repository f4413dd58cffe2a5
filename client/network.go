package client

import (
	"context"
	"net/http"
	"strconv"

	"github.com/kiln-sh/kiln/api"
)

// Network returns a sandbox's network: mode, egress policy, limits,
// whether its exposed ports are public, and its traffic access token.
func (c *Client) Network(ctx context.Context, id string) (*api.Network, error) {
	var n api.Network
	if err := c.call(ctx, http.MethodGet, sandboxPath(id, "network"), nil, nil, &n); err != nil {
		return nil, err
	}
	return &n, nil
}

// SetNetwork replaces a running sandbox's egress policy (Egress, Allow,
// Deny), limits and Public flag; new connections follow it at once. The
// mode cannot change. It returns the new settings.
func (c *Client) SetNetwork(ctx context.Context, id string, n api.Network) (*api.Network, error) {
	var out api.Network
	if err := c.call(ctx, http.MethodPut, sandboxPath(id, "network"), nil, n, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// NetworkUsage returns a networked sandbox's traffic counters.
func (c *Client) NetworkUsage(ctx context.Context, id string) (*api.NetworkUsage, error) {
	var u api.NetworkUsage
	if err := c.call(ctx, http.MethodGet, sandboxPath(id, "network", "usage"), nil, nil, &u); err != nil {
		return nil, err
	}
	return &u, nil
}

// PortHost is the host name that reaches port of sandbox id through the
// server's exposed-port proxy when a wildcard DNS name *.domain points at
// the server (E2B's getHost): "<port>-<id>.<domain>". Without such a
// name, send requests to the server with the E2b-Sandbox-Id and
// E2b-Sandbox-Port headers instead.
func PortHost(id string, port int, domain string) string {
	return strconv.Itoa(port) + "-" + id + "." + domain
}
