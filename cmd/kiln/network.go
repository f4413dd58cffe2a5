package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/network"
)

// openNetwork sets up sandbox networking as the config says
// (config.Network.Setup): off → nil; on → it or an error; auto (the
// default) → it where the host can, else nil after one warning, unless
// KILN_NETWORK_DEFAULT=nat asks for it explicitly.
func openNetwork(ctx context.Context, cfg config.Config, log *slog.Logger) (*network.Network, error) {
	setup := config.ParseNetworkSetup(cfg.Network.Setup)
	if setup == config.NetworkOff {
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
	if err == nil {
		return n, nil
	}
	if setup == config.NetworkOn || cfg.Network.DefaultMode == "nat" {
		return nil, fmt.Errorf("setting up sandbox networking (KILN_NETWORK=%s, KILN_NETWORK_DEFAULT=%s): %w",
			setup, cfg.Network.DefaultMode, err)
	}
	log.Warn("sandbox networking is off: this host cannot set it up, so sandboxes have loopback only and network requests are refused "+
		"(KILN_NETWORK=on makes this an error, KILN_NETWORK=off silences it)", "err", err.Error())
	return nil, nil
}

// networkFlag is serve's --network: auto, on or off; a bare --network
// (the older boolean flag) is on.
type networkFlag struct{ p *string }

func (f networkFlag) String() string {
	if f.p == nil || *f.p == "" {
		return config.NetworkAuto
	}
	return *f.p
}

func (f networkFlag) Set(s string) error {
	v := config.ParseNetworkSetup(s)
	switch v {
	case config.NetworkAuto, config.NetworkOn, config.NetworkOff:
		*f.p = v
		return nil
	}
	return fmt.Errorf("want auto, on or off")
}

func (networkFlag) IsBoolFlag() bool { return true }

// networkFlags are the network flags of sandbox create and sandbox
// network.
type networkFlags struct {
	fs          *flag.FlagSet
	n           api.Network
	allow, deny stringsFlag
}

func addNetworkFlags(fs *flag.FlagSet, withMode bool) *networkFlags {
	f := &networkFlags{fs: fs}
	if withMode {
		fs.StringVar(&f.n.Mode, "network", "", `network mode: "none" (loopback only) or "nat" (default: the server's)`)
	}
	fs.StringVar(&f.n.Egress, "egress", "", `what happens to destinations neither list names: "allow" (default) or "deny"`)
	fs.Var(&f.allow, "allow", "allowed `CIDR, address or domain` (repeatable or comma-separated)")
	fs.Var(&f.deny, "deny", "denied `CIDR, address or domain` (repeatable or comma-separated)")
	fs.BoolVar(&f.n.Public, "public", false, "exposed ports answer without an API key or traffic token")
	fs.Var(sizeFlag{&f.n.BandwidthBytes}, "bandwidth", "bytes per second in each direction, e.g. 10M (default: unlimited)")
	fs.IntVar(&f.n.MaxConnections, "max-connections", 0, "connections open at once (default: unlimited)")
	return f
}

// set reports whether any network flag was given.
func (f *networkFlags) set() bool {
	any := false
	f.fs.Visit(func(fl *flag.Flag) {
		switch fl.Name {
		case "network", "egress", "allow", "deny", "public", "bandwidth", "max-connections":
			any = true
		}
	})
	return any
}

// apply lays the flags given over n.
func (f *networkFlags) apply(n *api.Network) {
	f.fs.Visit(func(fl *flag.Flag) {
		switch fl.Name {
		case "network":
			n.Mode = f.n.Mode
		case "egress":
			n.Egress = f.n.Egress
		case "allow":
			n.Allow = splitList(f.allow)
		case "deny":
			n.Deny = splitList(f.deny)
		case "public":
			n.Public = f.n.Public
		case "bandwidth":
			n.BandwidthBytes = f.n.BandwidthBytes
		case "max-connections":
			n.MaxConnections = f.n.MaxConnections
		}
	})
}

// request is the create request's network, nil if no flag was given.
func (f *networkFlags) request() *api.Network {
	if !f.set() {
		return nil
	}
	var n api.Network
	f.apply(&n)
	if n.Mode == "" && (len(n.Allow) > 0 || len(n.Deny) > 0 || n.Egress != "" || n.Public) {
		n.Mode = "nat" // policy flags only make sense with a network
	}
	return &n
}

func splitList(vals []string) []string {
	var out []string
	for _, v := range vals {
		for _, e := range strings.Split(v, ",") {
			if e = strings.TrimSpace(e); e != "" {
				out = append(out, e)
			}
		}
	}
	return out
}

const networkUsage = `Usage: kiln sandbox network ID [flags]

Shows a sandbox's network (mode, egress policy, limits, whether its
exposed ports are public, its traffic token), or changes it live when
flags are given: the flags given replace those settings, the others stay.
--usage shows its traffic counters instead.

Exposed ports: a process listening on port P (on 0.0.0.0) is reachable
through the server as host P-ID.<domain> (a wildcard DNS name pointing at
the server) or with the headers E2b-Sandbox-Id: ID and E2b-Sandbox-Port: P;
unless it is public, send E2B-Traffic-Access-Token: TOKEN or your API key.

Examples:
  kiln sandbox network i8cx2kq0v7n3ma5wd1ef
  kiln sandbox network i8cx2kq0v7n3ma5wd1ef --egress deny --allow pypi.org,files.pythonhosted.org
  kiln sandbox network i8cx2kq0v7n3ma5wd1ef --deny 10.0.0.0/8 --bandwidth 5M
  kiln sandbox network i8cx2kq0v7n3ma5wd1ef --usage
  curl -H "E2b-Sandbox-Id: i8cx2kq0v7n3ma5wd1ef" -H "E2b-Sandbox-Port: 8080" \
       -H "E2B-Traffic-Access-Token: TOKEN" http://127.0.0.1:8420/
`

func (r *remote) sandboxNetwork(ctx context.Context, args []string) error {
	c := r.command("sandbox network", networkUsage)
	nf := addNetworkFlags(c.fs, false)
	usage := c.fs.Bool("usage", false, "show traffic counters")
	pos, err := c.parse(args, 1, 1)
	if err != nil {
		return err
	}
	id := pos[0]
	if *usage {
		u, err := r.c.NetworkUsage(ctx, id)
		if err != nil {
			return err
		}
		if *c.json {
			return r.printJSON(u)
		}
		fmt.Fprintf(r.stdout, "sent %d B, received %d B, %d connections, %d packets refused\n",
			u.SentBytes, u.ReceivedBytes, u.Connections, u.Drops)
		return nil
	}
	n, err := r.c.Network(ctx, id)
	if err != nil {
		return err
	}
	if nf.set() {
		nf.apply(n)
		if n, err = r.c.SetNetwork(ctx, id, *n); err != nil {
			return err
		}
	}
	if *c.json {
		return r.printJSON(n)
	}
	w := r.table()
	fmt.Fprintf(w, "mode\t%s\n", n.Mode)
	if n.Mode == "nat" {
		fmt.Fprintf(w, "address\t%s\negress\t%s\nallow\t%s\ndeny\t%s\npublic\t%v\n", n.Address, n.Egress,
			strings.Join(n.Allow, ", "), strings.Join(n.Deny, ", "), n.Public)
		fmt.Fprintf(w, "bandwidth\t%s\nmax connections\t%s\ntraffic token\t%s\n", limitText(n.BandwidthBytes, " B/s"),
			limitText(int64(n.MaxConnections), ""), n.TrafficToken)
	}
	return w.Flush()
}

func limitText(v int64, unit string) string {
	if v == 0 {
		return "unlimited"
	}
	return fmt.Sprint(v) + unit
}
