// Package network gives sandboxes their own network: a namespace per
// sandbox behind a per-sandbox router namespace that does NAT, enforces
// the sandbox's egress policy and traffic limits, and sends its DNS to a
// Kiln-controlled resolver that filters by name and learns the addresses
// of allowed names. Every sandbox sees the same inside address, so a
// checkpoint restored into another sandbox's namespace needs no
// renumbering.
//
//	sandbox ns "kiln-<id>"          router ns "kiln-<id>-gw"           host ns
//	eth0 10.11.0.2/30  ── veth ──  in0 10.11.0.1/30
//	                               up0 10.200.x.2/30  ── veth ──  kv<slot> 10.200.x.1/30 ── uplink
//	                               nft: policy, NAT, DNS DNAT          nft: protected ranges, NAT
//
// The host side may itself be a network namespace (Config.HostNS): tests
// put the whole thing in namespaces they make, with an "internet" of
// their own behind it.
package network

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// Inside addresses, the same in every sandbox.
var (
	// SandboxAddr is the sandbox's own address (eth0).
	SandboxAddr = netip.MustParseAddr("10.11.0.2")
	// GatewayAddr is the router's address on the sandbox's side; it is
	// also the sandbox's DNS server.
	GatewayAddr = netip.MustParseAddr("10.11.0.1")
)

// DefaultPool is the default range of the routers' outer links.
var DefaultPool = netip.MustParsePrefix("10.200.0.0/16")

// ResolvConf is the sandbox's /etc/resolv.conf.
const ResolvConf = "nameserver 10.11.0.1\noptions ndots:0 timeout:2 attempts:2\n"

// Config configures a host's sandbox networking.
type Config struct {
	// HostNS names the network namespace that stands for the host; ""
	// is the one kiln runs in. Tests use a namespace of their own.
	HostNS string
	// Pool holds one /30 per sandbox for the router's outer link; it must
	// not overlap the host's own networks. Default DefaultPool.
	Pool netip.Prefix
	// Upstream are the DNS servers (ip:port) the Kiln resolver asks;
	// default the host's /etc/resolv.conf nameservers.
	Upstream []string
}

// State is what must be kept of a sandbox's network to adopt it again
// after a restart of kiln serve.
type State struct {
	Slot   int    `json:"slot"`
	Policy Policy `json:"policy"`
	// Public says the sandbox's exposed ports answer anyone; otherwise a
	// request needs an API key or Token.
	Public bool   `json:"public"`
	Token  string `json:"token"` // traffic access token for exposed ports
	// MaskHost is the Host requests to its exposed ports carry instead of
	// the one the client used ("" keeps it); see Exposure.
	MaskHost string `json:"mask_host,omitempty"`
}

// Exposure is how a sandbox's exposed ports are served.
type Exposure struct {
	// Public: the ports answer anyone; otherwise a request needs an API
	// key or the traffic token.
	Public bool
	// MaskHost, if set, is the Host header of requests proxied to the
	// ports (E2B's maskRequestHost): a host[:port] in which "${PORT}"
	// stands for the port. ValidateMaskHost checks it.
	MaskHost string
}

// Network manages the networks of one host's sandboxes.
type Network struct {
	cfg Config
	log *slog.Logger

	lock    *os.File // the host namespace's (instance.go)
	udp     net.PacketConn
	tcp     net.Listener
	dnsPort int

	mu    sync.Mutex
	eps   map[string]*endpoint // by sandbox id
	bySrc map[netip.Addr]*endpoint
	slots map[int]string

	wg        sync.WaitGroup
	closeOnce sync.Once
}

// endpoint is one sandbox's network.
type endpoint struct {
	id   string
	slot int

	mu      sync.Mutex // serialises policy changes and learning
	policy  Policy
	rules   rules
	learned map[netip.Addr]learnt // allowed by DNS answers
	pairs   []string              // host set elements this sandbox added
	public  bool
	mask    string
	token   string
	qWindow time.Time // start of the current DNS rate window
	qCount  int
}

// learnt is an address an allowed name resolved to.
type learnt struct {
	until time.Time
	name  string
}

// New prepares the host side: forwarding, the host's nft table and the
// DNS resolver. Close undoes the table and stops the resolver.
func New(ctx context.Context, cfg Config, log *slog.Logger) (*Network, error) {
	if !cfg.Pool.IsValid() {
		cfg.Pool = DefaultPool
	}
	if !cfg.Pool.Addr().Is4() || cfg.Pool.Bits() > 29 {
		return nil, fmt.Errorf("network pool %s: want an IPv4 prefix of /29 or larger: %w", cfg.Pool, errdefs.ErrInvalidArgument)
	}
	cfg.Pool = cfg.Pool.Masked()
	if len(cfg.Upstream) == 0 {
		cfg.Upstream = hostResolvers("/etc/resolv.conf")
	}
	if err := CheckHost(); err != nil {
		return nil, err
	}
	lock, err := lockHostNS(cfg.HostNS)
	if err != nil {
		return nil, err
	}
	n := &Network{cfg: cfg, log: log, lock: lock, eps: map[string]*endpoint{}, bySrc: map[netip.Addr]*endpoint{},
		slots: map[int]string{}}
	fail := func(err error) (*Network, error) {
		n.closeDNS()
		lock.Close()
		return nil, err
	}
	if err := n.listenDNS(); err != nil {
		return fail(err)
	}
	if err := nsExec(ctx, cfg.HostNS, "", "sysctl", "-qw", "net.ipv4.ip_forward=1"); err != nil {
		return fail(fmt.Errorf("enabling forwarding: %w", err))
	}
	if err := nsExec(ctx, cfg.HostNS, n.hostRuleset(), "nft", "-f", "-"); err != nil {
		return fail(fmt.Errorf("installing host rules: %w", err))
	}
	n.wg.Add(2)
	go n.serveUDP()
	go n.serveTCP()
	return n, nil
}

// Close removes the host rules and stops the resolver. Sandbox networks
// stay for a later Network to Adopt.
func (n *Network) Close() error {
	var err error
	n.closeOnce.Do(func() {
		n.closeDNS()
		n.wg.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err = nsExec(ctx, n.cfg.HostNS, "", "nft", "delete", "table", "ip", "kiln")
		n.lock.Close() // after the table is gone: the next Network may start
	})
	return err
}

// HostNS is the host side's namespace name ("" for kiln's own).
func (n *Network) HostNS() string { return n.cfg.HostNS }

// SandboxNS is the name of sandbox id's own network namespace, which its
// container joins.
func SandboxNS(id string) string { return "kiln-" + id }

func routerNS(id string) string { return "kiln-" + id + "-gw" }

func hostLink(slot int) string { return "kv" + strconv.Itoa(slot) }

// slotAddrs are the host's and the router's addresses on a slot's link.
func (n *Network) slotAddrs(slot int) (host, router netip.Addr) {
	base := n.cfg.Pool.Addr().As4()
	v := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8 | uint32(base[3])
	v += uint32(slot) * 4
	a := func(x uint32) netip.Addr {
		return netip.AddrFrom4([4]byte{byte(x >> 24), byte(x >> 16), byte(x >> 8), byte(x)})
	}
	return a(v + 1), a(v + 2)
}

func (n *Network) maxSlots() int { return 1 << (32 - n.cfg.Pool.Bits() - 2) }

// Attach makes sandbox id's network with policy p: the sandbox and router
// namespaces, their links, NAT and rules. On error nothing is left.
func (n *Network) Attach(ctx context.Context, id string, p Policy, ex Exposure) (_ State, err error) {
	if err := p.Validate(); err != nil {
		return State{}, err
	}
	if err := ValidateMaskHost(ex.MaskHost); err != nil {
		return State{}, err
	}
	n.mu.Lock()
	slot := -1
	for i := range n.maxSlots() {
		if _, used := n.slots[i]; !used {
			slot = i
			break
		}
	}
	if slot < 0 {
		n.mu.Unlock()
		return State{}, fmt.Errorf("all %d sandbox network slots are in use: %w", n.maxSlots(), errdefs.ErrResourceExhausted)
	}
	n.slots[slot] = id
	n.mu.Unlock()
	defer func() {
		if err != nil {
			n.mu.Lock()
			delete(n.slots, slot)
			n.mu.Unlock()
			_ = n.teardown(context.WithoutCancel(ctx), id)
		}
	}()
	if err := n.build(ctx, id, slot); err != nil {
		return State{}, err
	}
	st := State{Slot: slot, Policy: p, Public: ex.Public, Token: rand.Text(), MaskHost: ex.MaskHost}
	if err := n.register(ctx, id, st); err != nil {
		return State{}, err
	}
	return st, nil
}

// build makes the namespaces and links of a sandbox in slot.
func (n *Network) build(ctx context.Context, id string, slot int) error {
	sns, rns := SandboxNS(id), routerNS(id)
	for _, ns := range []string{sns, rns} {
		if err := addNS(ctx, ns); err != nil {
			return fmt.Errorf("creating network namespace: %w", err)
		}
	}
	host, router := n.slotAddrs(slot)
	link := hostLink(slot)
	// A namespace's links die asynchronously after `ip netns del`: a link
	// of a network removed without Detach may still hold the name.
	_ = n.delHostLink(ctx, slot)
	if err := ipCmd(ctx, n.cfg.HostNS,
		"link add "+link+" type veth peer name up0 netns "+rns,
		"addr add "+host.String()+"/30 dev "+link,
		"link set "+link+" up",
	); err != nil {
		return fmt.Errorf("linking router to host: %w", err)
	}
	if err := ipCmd(ctx, rns,
		"link set lo up",
		"link add in0 type veth peer name eth0 netns "+sns,
		"addr add "+GatewayAddr.String()+"/30 dev in0",
		"link set in0 up",
		"addr add "+router.String()+"/30 dev up0",
		"link set up0 up",
		"route add default via "+host.String(),
	); err != nil {
		return fmt.Errorf("setting up router: %w", err)
	}
	if err := ipCmd(ctx, sns,
		"link set lo up",
		"addr add "+SandboxAddr.String()+"/30 dev eth0",
		"link set eth0 up",
		"route add default via "+GatewayAddr.String(),
	); err != nil {
		return fmt.Errorf("setting up sandbox link: %w", err)
	}
	if err := nsExec(ctx, rns, "", "sysctl", "-qw", "net.ipv4.ip_forward=1",
		"net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"); err != nil {
		return fmt.Errorf("enabling forwarding in router: %w", err)
	}
	return nil
}

// register installs a sandbox's rules and starts serving its DNS.
func (n *Network) register(ctx context.Context, id string, st State) error {
	ep := &endpoint{id: id, slot: st.Slot, learned: map[netip.Addr]learnt{}, public: st.Public, token: st.Token,
		mask: st.MaskHost}
	_, router := n.slotAddrs(st.Slot)
	if err := n.apply(ctx, ep, st.Policy); err != nil {
		return err
	}
	n.mu.Lock()
	n.eps[id] = ep
	n.bySrc[router] = ep
	n.slots[st.Slot] = id
	n.mu.Unlock()
	return nil
}

// Adopt takes over the network of a sandbox a previous process attached:
// its namespaces must exist, unless rebuild (the host rebooted; a paused
// sandbox, whose restore brings its own netstack, as a fork's does), which
// makes them again in the same slot; its rules are installed again (the
// resolver's port changed). On error nothing it made is left.
func (n *Network) Adopt(ctx context.Context, id string, st State, rebuild bool) (err error) {
	if err := st.Policy.Validate(); err != nil {
		return err
	}
	gone := false
	for _, ns := range []string{SandboxNS(id), routerNS(id)} {
		if _, err := os.Stat(NSPath(ns)); err != nil {
			if !rebuild {
				return fmt.Errorf("network namespace of sandbox %s is gone: %w", id, err)
			}
			gone = true
		}
	}
	if st.Slot < 0 || st.Slot >= n.maxSlots() {
		return fmt.Errorf("network slot %d outside the pool", st.Slot)
	}
	n.mu.Lock()
	if other, used := n.slots[st.Slot]; used && other != id {
		n.mu.Unlock()
		return fmt.Errorf("network slot %d is taken by sandbox %s", st.Slot, other)
	}
	n.slots[st.Slot] = id
	n.mu.Unlock()
	if gone {
		defer func() {
			if err != nil {
				n.mu.Lock()
				delete(n.slots, st.Slot)
				n.mu.Unlock()
				_ = n.teardown(context.WithoutCancel(ctx), id)
			}
		}()
		_ = n.teardown(ctx, id) // whichever half is left
		if err := n.build(ctx, id, st.Slot); err != nil {
			return err
		}
		n.log.Warn("made the network of a paused sandbox again (the host rebooted?)", "sandbox_id", id, "slot", st.Slot)
	}
	return n.register(ctx, id, st)
}

// Readdress gives sandbox id's eth0 its address and default route again.
// runsc moves them into its netstack (and off the interface) when it
// starts, and a restore (resume of a paused sandbox) looks for them on the
// interface: without them it leaves the interface out.
func (n *Network) Readdress(ctx context.Context, id string) error {
	if _, err := n.endpoint(id); err != nil {
		return err
	}
	if err := ipCmd(ctx, SandboxNS(id),
		"addr replace "+SandboxAddr.String()+"/30 dev eth0",
		"route replace default via "+GatewayAddr.String(),
	); err != nil {
		return fmt.Errorf("readdressing sandbox link: %w", err)
	}
	return nil
}

// Detach removes sandbox id's network. Removing a network that is not
// there succeeds.
func (n *Network) Detach(ctx context.Context, id string) error {
	n.mu.Lock()
	ep := n.eps[id]
	if ep != nil {
		delete(n.eps, id)
		_, router := n.slotAddrs(ep.slot)
		delete(n.bySrc, router)
	}
	n.mu.Unlock()
	var errs []error
	if ep != nil {
		ep.mu.Lock()
		errs = append(errs, n.setPairs(ctx, ep, nil))
		ep.mu.Unlock()
		// Deleting the host's end takes the router's with it at once,
		// so the slot is free when Detach returns.
		errs = append(errs, n.delHostLink(ctx, ep.slot))
	}
	errs = append(errs, n.teardown(ctx, id))
	if ep != nil {
		n.mu.Lock()
		if n.slots[ep.slot] == id {
			delete(n.slots, ep.slot)
		}
		n.mu.Unlock()
	}
	return errors.Join(errs...)
}

func (n *Network) teardown(ctx context.Context, id string) error { return Remove(ctx, id) }

// delHostLink deletes a slot's host-side link if it exists.
func (n *Network) delHostLink(ctx context.Context, slot int) error {
	link := hostLink(slot)
	if err := inNS(n.cfg.HostNS, func() error {
		_, err := net.InterfaceByName(link)
		return err
	}); err != nil {
		return nil // not there
	}
	return ipCmd(ctx, n.cfg.HostNS, "link del "+link)
}

// Remove removes sandbox id's namespaces, if any; their links go with
// them (a host without a Network uses it to clean up after one).
func Remove(ctx context.Context, id string) error {
	var errs []error
	for _, ns := range []string{routerNS(id), SandboxNS(id)} {
		if err := delNS(ctx, ns); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("removing network of sandbox %s: %w", id, err)
	}
	return nil
}

func (n *Network) endpoint(id string) (*endpoint, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	ep := n.eps[id]
	if ep == nil {
		return nil, fmt.Errorf("sandbox %s has no network: %w", id, errdefs.ErrNotFound)
	}
	return ep, nil
}

// State returns sandbox id's network state.
func (n *Network) State(id string) (State, error) {
	ep, err := n.endpoint(id)
	if err != nil {
		return State{}, err
	}
	ep.mu.Lock()
	defer ep.mu.Unlock()
	return ep.state(), nil
}

func (ep *endpoint) state() State {
	return State{Slot: ep.slot, Policy: ep.policy, Public: ep.public, Token: ep.token, MaskHost: ep.mask}
}

// Has reports whether sandbox id has a network.
func (n *Network) Has(id string) bool {
	_, err := n.endpoint(id)
	return err == nil
}

// SetPolicy replaces a sandbox's policy and how its ports are exposed;
// new connections and DNS queries follow it at once (established
// connections keep flowing).
func (n *Network) SetPolicy(ctx context.Context, id string, p Policy, ex Exposure) (State, error) {
	if err := p.Validate(); err != nil {
		return State{}, err
	}
	if err := ValidateMaskHost(ex.MaskHost); err != nil {
		return State{}, err
	}
	ep, err := n.endpoint(id)
	if err != nil {
		return State{}, err
	}
	if err := n.apply(ctx, ep, p); err != nil {
		return State{}, err
	}
	ep.mu.Lock()
	defer ep.mu.Unlock()
	ep.public, ep.mask = ex.Public, ex.MaskHost
	return ep.state(), nil
}

// Dial connects to port on sandbox id's address, from the host side.
func (n *Network) Dial(ctx context.Context, id string, port int) (net.Conn, error) {
	ep, err := n.endpoint(id)
	if err != nil {
		return nil, err
	}
	_, router := n.slotAddrs(ep.slot)
	return DialIn(ctx, n.cfg.HostNS, "tcp", netip.AddrPortFrom(router, uint16(port)).String())
}

// hostResolvers reads the nameservers of a resolv.conf.
func hostResolvers(path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []string
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "nameserver" {
			if a, err := netip.ParseAddr(f[1]); err == nil && a.Is4() {
				out = append(out, netip.AddrPortFrom(a, 53).String())
			}
		}
	}
	return out
}

// Addr is sandbox id's address as the host reaches it (its router's outer
// address, which forwards every port to the sandbox).
func (n *Network) Addr(id string) (netip.Addr, error) {
	ep, err := n.endpoint(id)
	if err != nil {
		return netip.Addr{}, err
	}
	_, router := n.slotAddrs(ep.slot)
	return router, nil
}
