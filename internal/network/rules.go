package network

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
)

// protected are ranges no sandbox reaches unless its policy allows them
// by an explicit entry: link-local (cloud metadata services) and, added by
// hostRuleset, the pool (other sandboxes). The host's own addresses are
// covered by the host's input chain.
var protected = []string{"169.254.0.0/16", "127.0.0.0/8", "0.0.0.0/8"}

// hostRuleset is the host side's table: sandboxes may reach the host only
// for DNS (and what a policy allows explicitly), never each other or
// link-local unless allowed; nothing from outside may open connections to
// them; their traffic is masqueraded on the way out.
func (n *Network) hostRuleset() string {
	port := strconv.Itoa(n.dnsPort)
	return `table ip kiln
delete table ip kiln
table ip kiln {
	set pairs { type ipv4_addr . ipv4_addr; flags interval; }
	chain input {
		type filter hook input priority filter; policy accept;
		iifname "kv*" ct state established,related accept
		iifname "kv*" meta l4proto { tcp, udp } th dport ` + port + ` accept
		iifname "kv*" ip saddr . ip daddr @pairs accept
		iifname "kv*" goto refuse
		meta l4proto { tcp, udp } th dport ` + port + ` drop
	}
	chain forward {
		type filter hook forward priority filter; policy accept;
		ct state established,related accept
		iifname "kv*" ip saddr . ip daddr @pairs accept
		oifname "kv*" iifname "kv*" goto refuse
		oifname "kv*" drop
		iifname "kv*" ip daddr { ` + strings.Join(protected, ", ") + ` } goto refuse
	}
	chain refuse {
		meta l4proto tcp reject with tcp reset
		reject with icmp type admin-prohibited
	}
	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		ip saddr ` + n.cfg.Pool.String() + ` oifname != "kv*" masquerade
	}
}
`
}

// apply makes p a sandbox's policy: the router's whole table is replaced
// in one transaction, the host's exceptions for it updated and its
// traffic shaping set.
func (n *Network) apply(ctx context.Context, ep *endpoint, p Policy) error {
	r := p.rules()
	// Names are resolved before taking the lock: the resolver needs it.
	allowIPs := n.resolveAll(ctx, r.allowDomains)
	denyIPs := n.resolveAll(ctx, r.denyDomains)

	ep.mu.Lock()
	defer ep.mu.Unlock()
	now := time.Now()
	for a, l := range ep.learned {
		if now.After(l.until) || !matchDomain(l.name, r.allowDomains) {
			delete(ep.learned, a)
		}
	}
	var allow []string
	for _, pfx := range r.allowNets {
		allow = append(allow, pfx.String())
	}
	for _, a := range allowIPs {
		allow = append(allow, a.String())
	}
	for a := range ep.learned {
		allow = append(allow, a.String())
	}
	var deny []string
	for _, pfx := range r.denyNets {
		deny = append(deny, pfx.String())
	}
	for _, a := range denyIPs {
		deny = append(deny, a.String())
	}
	if err := nsExec(ctx, routerNS(ep.id), n.routerRuleset(ep.slot, p, allow, deny), "nft", "-f", "-"); err != nil {
		return fmt.Errorf("installing sandbox network policy: %w", err)
	}
	var pairs []string
	_, router := n.slotAddrs(ep.slot)
	for _, pfx := range r.allowNets {
		if pfx.Bits() > 0 {
			pairs = append(pairs, router.String()+" . "+pfx.String())
		}
	}
	if err := n.setPairs(ctx, ep, pairs); err != nil {
		return err
	}
	if err := shape(ctx, routerNS(ep.id), p.BandwidthBytes); err != nil {
		return err
	}
	ep.policy, ep.rules = p, r
	return nil
}

// routerRuleset is a sandbox router's table: DNS to the Kiln resolver,
// inbound connections from the host to the sandbox, and the egress policy.
func (n *Network) routerRuleset(slot int, p Policy, allow, deny []string) string {
	host, router := n.slotAddrs(slot)
	port := strconv.Itoa(n.dnsPort)
	def := "accept"
	if p.Egress == EgressDeny {
		def = "goto refuse"
	}
	var b strings.Builder
	b.WriteString("table ip kiln\ndelete table ip kiln\ntable ip kiln {\n")
	b.WriteString("\tcounter drops { }\n\tcounter conns { }\n")
	fmt.Fprintf(&b, "\tset allow { type ipv4_addr; flags interval; auto-merge; %s}\n", elements(allow))
	fmt.Fprintf(&b, "\tset deny { type ipv4_addr; flags interval; auto-merge; %s}\n", elements(deny))
	fmt.Fprintf(&b, `	chain prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		iifname "in0" ip daddr %[1]s udp dport 53 dnat to %[2]s:%[3]s
		iifname "in0" ip daddr %[1]s tcp dport 53 dnat to %[2]s:%[3]s
		iifname "up0" ip daddr %[4]s dnat to %[5]s
	}
	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		oifname "up0" masquerade
	}
	chain input {
		type filter hook input priority filter; policy accept;
		iifname "in0" ct state established,related accept
		iifname "in0" icmp type echo-request accept
		iifname "in0" counter name drops drop
	}
	chain refuse {
		counter name drops
		meta l4proto tcp reject with tcp reset
		reject with icmp type admin-prohibited
	}
	chain forward {
		type filter hook forward priority filter; policy accept;
		ct state established,related accept
		iifname "up0" ct status dnat accept
		iifname "up0" drop
		iifname "in0" ip daddr %[2]s meta l4proto { tcp, udp } th dport %[3]s accept
		iifname "in0" ct state new counter name conns
`, GatewayAddr, host, port, router, SandboxAddr)
	if p.MaxConnections > 0 {
		fmt.Fprintf(&b, "\t\tiifname \"in0\" ct state new ct count over %d goto refuse\n", p.MaxConnections)
	}
	fmt.Fprintf(&b, `		iifname "in0" ip daddr @allow accept
		iifname "in0" ip daddr @deny goto refuse
		iifname "in0" %s
	}
}
`, def)
	return b.String()
}

func elements(addrs []string) string {
	if len(addrs) == 0 {
		return ""
	}
	return "elements = { " + strings.Join(addrs, ", ") + " }; "
}

// setPairs replaces the host's exceptions (sandbox address . allowed
// range) for one sandbox. Callers hold ep.mu.
func (n *Network) setPairs(ctx context.Context, ep *endpoint, pairs []string) error {
	if slices.Equal(pairs, ep.pairs) {
		return nil
	}
	var script strings.Builder
	if len(ep.pairs) > 0 {
		fmt.Fprintf(&script, "delete element ip kiln pairs { %s }\n", strings.Join(ep.pairs, ", "))
	}
	if len(pairs) > 0 {
		fmt.Fprintf(&script, "add element ip kiln pairs { %s }\n", strings.Join(pairs, ", "))
	}
	if err := nsExec(ctx, n.cfg.HostNS, script.String(), "nft", "-f", "-"); err != nil {
		return fmt.Errorf("updating host exceptions: %w", err)
	}
	ep.pairs = pairs
	return nil
}

// learn adds addresses from an allowed name's DNS answer to the sandbox's
// allowed set before the answer goes back to it.
func (n *Network) learn(ctx context.Context, ep *endpoint, name string, addrs []netip.Addr, ttl time.Duration) error {
	ttl = min(max(ttl, time.Minute), time.Hour)
	ep.mu.Lock()
	defer ep.mu.Unlock()
	var add []string
	until := time.Now().Add(ttl)
	for _, a := range addrs {
		if _, ok := ep.learned[a]; !ok {
			add = append(add, a.String())
		}
		ep.learned[a] = learnt{until: until, name: name}
	}
	if len(add) == 0 {
		return nil
	}
	return nsExec(ctx, routerNS(ep.id), "add element ip kiln allow { "+strings.Join(add, ", ")+" }\n", "nft", "-f", "-")
}

// shape sets (or, with 0, removes) a token bucket on both of a router's
// links: up0 carries the sandbox's uploads, in0 its downloads.
func shape(ctx context.Context, rns string, bytesPerSec int64) error {
	for _, dev := range []string{"up0", "in0"} {
		if bytesPerSec == 0 {
			_ = ipTC(ctx, rns, "qdisc", "del", "dev", dev, "root")
			continue
		}
		burst := max(bytesPerSec/20, 64<<10)
		if err := ipTC(ctx, rns, "qdisc", "replace", "dev", dev, "root", "tbf",
			"rate", strconv.FormatInt(bytesPerSec*8, 10)+"bit",
			"burst", strconv.FormatInt(burst, 10), "latency", "200ms"); err != nil {
			return fmt.Errorf("limiting bandwidth: %w", err)
		}
	}
	return nil
}

func ipTC(ctx context.Context, ns string, args ...string) error {
	return runCmd(ctx, "", "tc", append([]string{"-n", ns}, args...)...)
}
