package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"

	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/network"
)

// openNetwork sets up sandbox networking when the config enables it; nil
// without.
func openNetwork(ctx context.Context, cfg config.Config, log *slog.Logger) (*network.Network, error) {
	if !cfg.Network.Enable {
		return nil, nil
	}
	nc := network.Config{HostNS: cfg.Network.HostNS}
	if cfg.Network.Pool != "" {
		p, err := netip.ParsePrefix(cfg.Network.Pool)
		if err != nil {
			return nil, fmt.Errorf("network pool: %w", err)
		}
		nc.Pool = p
	}
	for _, d := range cfg.Network.DNS {
		if a, err := netip.ParseAddr(d); err == nil {
			d = netip.AddrPortFrom(a, 53).String()
		}
		nc.Upstream = append(nc.Upstream, d)
	}
	n, err := network.New(ctx, nc, log)
	if err != nil {
		return nil, fmt.Errorf("setting up sandbox networking (KILN_NETWORK=on): %w", err)
	}
	return n, nil
}
