package network

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// The Kiln resolver: every sandbox's DNS goes to it (its router DNATs
// port 53 of the gateway here). It knows the sandbox by the source
// address, answers REFUSED for names the policy does not allow, forwards
// the rest to the host's upstream servers and, for names on the allow
// list, adds the answer's addresses to the sandbox's allowed set before
// replying.

const (
	dnsTimeout  = 3 * time.Second
	maxDNSMsg   = 65535
	maxInflight = 256 // concurrent queries over UDP, all sandboxes
	// maxQueryRate bounds one sandbox's queries per second, so that one
	// cannot starve the others' DNS; past it queries go unanswered (the
	// client retries).
	maxQueryRate = 300
)

func (n *Network) listenDNS() error {
	// UDP and TCP on the same port, chosen by the kernel.
	for range 20 {
		udp, err := ListenPacketIn(n.cfg.HostNS, "udp4", "0.0.0.0:0")
		if err != nil {
			return fmt.Errorf("listening for DNS: %w", err)
		}
		port := udp.LocalAddr().(*net.UDPAddr).Port
		tcp, err := ListenIn(n.cfg.HostNS, "tcp4", fmt.Sprintf("0.0.0.0:%d", port))
		if err != nil {
			udp.Close()
			continue
		}
		n.udp, n.tcp, n.dnsPort = udp, tcp, port
		return nil
	}
	return errors.New("listening for DNS: no port free for both UDP and TCP")
}

func (n *Network) closeDNS() {
	if n.udp != nil {
		n.udp.Close()
	}
	if n.tcp != nil {
		n.tcp.Close()
	}
}

func (n *Network) serveUDP() {
	defer n.wg.Done()
	sem := make(chan struct{}, maxInflight)
	for {
		buf := make([]byte, 4096)
		nr, from, err := n.udp.ReadFrom(buf)
		if err != nil {
			return
		}
		src, ok := netip.AddrFromSlice(from.(*net.UDPAddr).IP.To4())
		if !ok {
			continue
		}
		select {
		case sem <- struct{}{}:
		default:
			continue // overloaded: the client retries
		}
		go func() {
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(context.Background(), dnsTimeout)
			defer cancel()
			if resp := n.answer(ctx, src, buf[:nr], false); resp != nil {
				_, _ = n.udp.WriteTo(resp, from)
			}
		}()
	}
}

func (n *Network) serveTCP() {
	defer n.wg.Done()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := n.tcp.Accept()
		if err != nil {
			return
		}
		wg.Go(func() {
			defer c.Close()
			src, ok := netip.AddrFromSlice(c.RemoteAddr().(*net.TCPAddr).IP.To4())
			if !ok {
				return
			}
			for {
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				q, err := readTCPMsg(c)
				if err != nil {
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), dnsTimeout)
				resp := n.answer(ctx, src, q, true)
				cancel()
				if resp == nil || writeTCPMsg(c, resp) != nil {
					return
				}
			}
		})
	}
}

func readTCPMsg(r io.Reader) ([]byte, error) {
	var l [2]byte
	if _, err := io.ReadFull(r, l[:]); err != nil {
		return nil, err
	}
	msg := make([]byte, binary.BigEndian.Uint16(l[:]))
	_, err := io.ReadFull(r, msg)
	return msg, err
}

func writeTCPMsg(w io.Writer, msg []byte) error {
	b := binary.BigEndian.AppendUint16(nil, uint16(len(msg)))
	_, err := w.Write(append(b, msg...))
	return err
}

// answer returns the reply to query q from a sandbox's router address
// src, or nil to say nothing.
func (n *Network) answer(ctx context.Context, src netip.Addr, q []byte, tcp bool) []byte {
	n.mu.Lock()
	ep := n.bySrc[src]
	n.mu.Unlock()
	if ep == nil || !ep.allowQuery(time.Now()) {
		return nil
	}
	var p dnsmessage.Parser
	h, err := p.Start(q)
	if err != nil || h.Response {
		return nil
	}
	qs, err := p.AllQuestions()
	if err != nil || len(qs) != 1 {
		return reply(h, qs, dnsmessage.RCodeFormatError)
	}
	name := strings.ToLower(strings.TrimSuffix(qs[0].Name.String(), "."))
	ep.mu.Lock()
	answer, learn := ep.rules.nameVerdict(ep.policy.Egress, name)
	ep.mu.Unlock()
	if !answer {
		return reply(h, qs, dnsmessage.RCodeRefused)
	}
	resp, err := n.exchange(ctx, q, tcp)
	if err != nil {
		n.log.Debug("dns upstream", "err", err)
		return reply(h, qs, dnsmessage.RCodeServerFailure)
	}
	if learn {
		addrs, ttl := aRecords(resp)
		if len(addrs) > 0 {
			if err := n.learn(ctx, ep, name, addrs, ttl); err != nil {
				n.log.Error("allowing resolved addresses", "sandbox_id", ep.id, "err", err)
				return reply(h, qs, dnsmessage.RCodeServerFailure)
			}
		}
	}
	return resp
}

// allowQuery counts a query against the sandbox's rate (a fixed
// one-second window).
func (ep *endpoint) allowQuery(now time.Time) bool {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if now.Sub(ep.qWindow) >= time.Second {
		ep.qWindow, ep.qCount = now, 0
	}
	ep.qCount++
	return ep.qCount <= maxQueryRate
}

// reply is an answer with no records and rcode.
func reply(h dnsmessage.Header, qs []dnsmessage.Question, rcode dnsmessage.RCode) []byte {
	m := dnsmessage.Message{
		Header: dnsmessage.Header{ID: h.ID, Response: true, OpCode: h.OpCode,
			RecursionDesired: h.RecursionDesired, RecursionAvailable: true, RCode: rcode},
		Questions: qs,
	}
	b, err := m.Pack()
	if err != nil {
		return nil
	}
	return b
}

// aRecords returns the IPv4 addresses in a response's answers (every name
// of a CNAME chain) and the smallest TTL.
func aRecords(resp []byte) ([]netip.Addr, time.Duration) {
	var p dnsmessage.Parser
	if _, err := p.Start(resp); err != nil {
		return nil, 0
	}
	if err := p.SkipAllQuestions(); err != nil {
		return nil, 0
	}
	var out []netip.Addr
	ttl := time.Duration(0)
	for {
		h, err := p.AnswerHeader()
		if err != nil {
			break
		}
		if h.Type != dnsmessage.TypeA {
			if err := p.SkipAnswer(); err != nil {
				break
			}
			continue
		}
		r, err := p.AResource()
		if err != nil {
			break
		}
		out = append(out, netip.AddrFrom4(r.A))
		if d := time.Duration(h.TTL) * time.Second; ttl == 0 || d < ttl {
			ttl = d
		}
	}
	return out, ttl
}

// exchange asks the upstream servers in turn, from the host side.
func (n *Network) exchange(ctx context.Context, q []byte, tcp bool) ([]byte, error) {
	if len(n.cfg.Upstream) == 0 {
		return nil, errors.New("no upstream DNS servers")
	}
	var errs []error
	for _, up := range n.cfg.Upstream {
		resp, err := n.exchangeOne(ctx, up, q, tcp)
		if err == nil {
			return resp, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

func (n *Network) exchangeOne(ctx context.Context, server string, q []byte, tcp bool) ([]byte, error) {
	network := "udp4"
	if tcp {
		network = "tcp4"
	}
	c, err := DialIn(ctx, n.cfg.HostNS, network, server)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if d, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(d)
	}
	if tcp {
		if err := writeTCPMsg(c, q); err != nil {
			return nil, err
		}
		return readTCPMsg(c)
	}
	if _, err := c.Write(q); err != nil {
		return nil, err
	}
	buf := make([]byte, maxDNSMsg)
	nr, err := c.Read(buf)
	if err != nil {
		return nil, err
	}
	return buf[:nr], nil
}

// resolveAll looks up the IPv4 addresses of names (for policies that name
// domains: their addresses are allowed or denied even when a sandbox
// uses them without asking DNS). Names that fail to resolve are skipped.
func (n *Network) resolveAll(ctx context.Context, names []string) []netip.Addr {
	var out []netip.Addr
	for _, name := range names {
		ctx, cancel := context.WithTimeout(ctx, dnsTimeout)
		addrs, err := n.lookupA(ctx, name)
		cancel()
		if err != nil {
			n.log.Debug("resolving policy name", "name", name, "err", err)
		}
		out = append(out, addrs...)
	}
	return out
}

func (n *Network) lookupA(ctx context.Context, name string) ([]netip.Addr, error) {
	qn, err := dnsmessage.NewName(name + ".")
	if err != nil {
		return nil, err
	}
	m := dnsmessage.Message{
		Header:    dnsmessage.Header{ID: uint16(time.Now().UnixNano()), RecursionDesired: true},
		Questions: []dnsmessage.Question{{Name: qn, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}},
	}
	q, err := m.Pack()
	if err != nil {
		return nil, err
	}
	resp, err := n.exchange(ctx, q, false)
	if err != nil {
		return nil, err
	}
	addrs, _ := aRecords(resp)
	return addrs, nil
}
