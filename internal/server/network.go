package server

import (
	"fmt"
	"net/http"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/network"
	"github.com/kiln-sh/kiln/internal/proxy"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// getNetwork answers a sandbox's network settings, with its traffic token.
func (s *Server) getNetwork(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.lookup(r)
	if err != nil {
		return err
	}
	n, err := s.m.Network(sb.ID)
	if err != nil {
		return fmt.Errorf("reading sandbox network: %w", err)
	}
	return writeJSON(w, http.StatusOK, toAPINetwork(n))
}

// setNetwork replaces a live sandbox's egress policy, limits and public
// flag.
func (s *Server) setNetwork(w http.ResponseWriter, r *http.Request) error {
	var req api.Network
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	sb, err := s.lookup(r)
	if err != nil {
		return err
	}
	n, err := s.m.SetNetwork(r.Context(), sb.ID, networkOptions(&req))
	if err != nil {
		return fmt.Errorf("changing sandbox network: %w", err)
	}
	return writeJSON(w, http.StatusOK, toAPINetwork(n))
}

// networkOptions converts a request's network; nil stays nil (defaults).
func networkOptions(n *api.Network) sandbox.NetworkOptions {
	if n == nil {
		return sandbox.NetworkOptions{}
	}
	return sandbox.NetworkOptions{Mode: n.Mode, Public: n.Public, MaskHost: n.MaskHost, Policy: network.Policy{
		Egress: n.Egress, Allow: n.Allow, Deny: n.Deny,
		BandwidthBytes: n.BandwidthBytes, MaxConnections: n.MaxConnections,
	}}
}

func toAPINetwork(n sandbox.NetworkInfo) *api.Network {
	p := n.Policy
	return &api.Network{Mode: n.Mode, Egress: p.Egress, Allow: p.Allow, Deny: p.Deny, Public: n.Public,
		BandwidthBytes: p.BandwidthBytes, MaxConnections: p.MaxConnections,
		MaskHost: n.MaskHost, Address: n.Address, TrafficToken: n.Token}
}

// networkUsage answers a networked sandbox's traffic counters.
func (s *Server) networkUsage(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.lookup(r)
	if err != nil {
		return err
	}
	st, err := s.m.NetworkStats(r.Context(), sb.ID)
	if err != nil {
		return fmt.Errorf("reading network usage: %w", err)
	}
	return writeJSON(w, http.StatusOK, api.NetworkUsage{SentBytes: st.SentBytes, ReceivedBytes: st.ReceivedBytes,
		Connections: st.Connections, Drops: st.Drops})
}

// portProxy is the exposed-port proxy the E2B router hands ports other
// than envd's and the code interpreter's to. A request without the
// sandbox's traffic token may use an API key that owns the sandbox (or an
// admin key).
func (s *Server) portProxy() *proxy.Proxy {
	return proxy.New(s.m, func(r *http.Request, sb sandbox.Sandbox) bool {
		if err := s.authenticate(r, 0); err != nil {
			return false
		}
		k := caller(r)
		return k.Admin || k.ID == sb.Owner
	}, s.log.With("component", "proxy"))
}

// createNetwork is a create request's network, nil for the defaults.
func createNetwork(n *api.Network) *sandbox.NetworkOptions {
	if n == nil {
		return nil
	}
	o := networkOptions(n)
	return &o
}
