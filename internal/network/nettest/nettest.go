// Package nettest builds a private world of network namespaces for tests
// of sandbox networking: a "host" namespace that stands for the machine
// kiln runs on, and an "internet" namespace behind its uplink with web
// servers, a DNS server and a fake metadata service. Tests send traffic
// only to these namespaces and to loopback, never to a real network.
package nettest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/kiln-sh/kiln/internal/network"
	"github.com/kiln-sh/kiln/internal/oci/ocitest"
)

// Addresses in the world (documentation ranges, never routed for real).
var (
	HostAddr     = netip.MustParseAddr("192.0.2.1") // the host's uplink address
	InternetAddr = netip.MustParseAddr("192.0.2.2") // the internet's router, DNS server and a web server
	MetadataAddr = netip.MustParseAddr("169.254.169.254")
)

// World is a host namespace with an internet behind it.
type World struct {
	Host, Internet string // namespace names

	mu    sync.Mutex
	names map[string][]netip.Addr // DNS: name → A records
}

// New makes a world and removes it when the test ends. It skips without
// root (fails with CI=true).
func New(t testing.TB) *World {
	t.Helper()
	ocitest.RequireRoot(t)
	_, err := exec.LookPath("nft")
	ocitest.Require(t, err == nil, "nft not installed (scripts/setup-deps.sh)")
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	tag := hex.EncodeToString(b)
	w := &World{Host: "kilnt-" + tag + "-host", Internet: "kilnt-" + tag + "-net", names: map[string][]netip.Addr{}}
	t.Cleanup(func() {
		for _, ns := range []string{w.Host, w.Internet} {
			_ = exec.Command("ip", "netns", "del", ns).Run()
		}
	})
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	run("ip", "netns", "add", w.Host)
	run("ip", "netns", "add", w.Internet)
	run("ip", "-n", w.Host, "link", "set", "lo", "up")
	run("ip", "-n", w.Internet, "link", "set", "lo", "up")
	run("ip", "-n", w.Host, "link", "add", "uplink", "type", "veth", "peer", "name", "eth0", "netns", w.Internet)
	run("ip", "-n", w.Host, "addr", "add", HostAddr.String()+"/24", "dev", "uplink")
	run("ip", "-n", w.Host, "link", "set", "uplink", "up")
	run("ip", "-n", w.Host, "route", "add", "default", "via", InternetAddr.String())
	run("ip", "-n", w.Internet, "addr", "add", InternetAddr.String()+"/24", "dev", "eth0")
	run("ip", "-n", w.Internet, "link", "set", "eth0", "up")
	run("ip", "-n", w.Internet, "addr", "add", MetadataAddr.String()+"/32", "dev", "lo")
	// The internet routes the sandboxes' pool back to the host only if it
	// is not masqueraded; it is, so nothing else is needed.
	w.serveDNS(t)
	return w
}

// AddSite gives the internet address a (added to its loopback), answers
// DNS for names with it, and serves HTTP on a:80 answering body.
func (w *World) AddSite(t testing.TB, a netip.Addr, body string, names ...string) {
	t.Helper()
	if a != InternetAddr && a != MetadataAddr {
		if out, err := exec.Command("ip", "-n", w.Internet, "addr", "add", a.String()+"/32", "dev", "lo").CombinedOutput(); err != nil {
			t.Fatalf("adding address %s: %v: %s", a, err, out)
		}
	}
	w.mu.Lock()
	for _, n := range names {
		w.names[strings.ToLower(n)] = append(w.names[strings.ToLower(n)], a)
	}
	w.mu.Unlock()
	w.ServeHTTP(t, w.Internet, netip.AddrPortFrom(a, 80).String(), body)
}

// ServeHTTP serves body over HTTP on addr in namespace ns until the test
// ends.
func (w *World) ServeHTTP(t testing.TB, ns, addr, body string) {
	t.Helper()
	l, err := network.ListenIn(ns, "tcp4", addr)
	if err != nil {
		t.Fatalf("listening on %s in %s: %v", addr, ns, err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/bytes" { // a large download for throughput
			rw.Header().Set("Content-Type", "application/octet-stream")
			buf := make([]byte, 64<<10)
			for range 256 { // 16 MiB
				if _, err := rw.Write(buf); err != nil {
					return
				}
			}
			return
		}
		if r.Method == http.MethodPost {
			_, _ = io.Copy(io.Discard, r.Body)
		}
		_, _ = io.WriteString(rw, body)
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
}

// serveDNS answers A queries from w.names on the internet's address, over
// UDP and TCP.
func (w *World) serveDNS(t testing.TB) {
	t.Helper()
	addr := netip.AddrPortFrom(InternetAddr, 53).String()
	pc, err := network.ListenPacketIn(w.Internet, "udp4", addr)
	if err != nil {
		t.Fatalf("listening for DNS: %v", err)
	}
	t.Cleanup(func() { pc.Close() })
	l, err := network.ListenIn(w.Internet, "tcp4", addr)
	if err != nil {
		t.Fatalf("listening for DNS: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var n [2]byte
				if _, err := io.ReadFull(c, n[:]); err != nil {
					return
				}
				q := make([]byte, int(n[0])<<8|int(n[1]))
				if _, err := io.ReadFull(c, q); err != nil {
					return
				}
				if resp := w.dnsAnswer(q); resp != nil {
					_, _ = c.Write(append([]byte{byte(len(resp) >> 8), byte(len(resp))}, resp...))
				}
			}()
		}
	}()
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if resp := w.dnsAnswer(buf[:n]); resp != nil {
				_, _ = pc.WriteTo(resp, from)
			}
		}
	}()
}

func (w *World) dnsAnswer(q []byte) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(q)
	if err != nil {
		return nil
	}
	qs, err := p.AllQuestions()
	if err != nil || len(qs) != 1 {
		return nil
	}
	m := dnsmessage.Message{Header: dnsmessage.Header{ID: h.ID, Response: true, RecursionDesired: h.RecursionDesired,
		RecursionAvailable: true}, Questions: qs}
	name := strings.ToLower(strings.TrimSuffix(qs[0].Name.String(), "."))
	w.mu.Lock()
	addrs, ok := w.names[name]
	w.mu.Unlock()
	if !ok {
		m.Header.RCode = dnsmessage.RCodeNameError
	}
	if qs[0].Type == dnsmessage.TypeA {
		for _, a := range addrs {
			m.Answers = append(m.Answers, dnsmessage.Resource{
				Header: dnsmessage.ResourceHeader{Name: qs[0].Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: 60},
				Body:   &dnsmessage.AResource{A: a.As4()},
			})
		}
	}
	b, _ := m.Pack()
	return b
}

// Upstream is the world's DNS server, for network.Config.Upstream.
func (w *World) Upstream() []string { return []string{netip.AddrPortFrom(InternetAddr, 53).String()} }

// Config is a network.Config for this world.
func (w *World) Config() network.Config {
	return network.Config{HostNS: w.Host, Upstream: w.Upstream()}
}

// Get fetches url from namespace ns with a short timeout and returns the
// body, or an error if it could not connect.
func Get(ctx context.Context, ns, url string) (string, error) {
	tr := &http.Transport{DialContext: func(ctx context.Context, nw, addr string) (net.Conn, error) {
		return network.DialIn(ctx, ns, nw, addr)
	}, DisableKeepAlives: true}
	c := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return string(b), fmt.Errorf("status %s", resp.Status)
	}
	return string(b), err
}

// Sites of Standard worlds.
var (
	AllowedSite = netip.MustParseAddr("198.51.100.10") // allowed.test, answers "allowed"
	DeniedSite  = netip.MustParseAddr("198.51.100.20") // denied.test and www.denied.test, "denied"
	CIDRSite    = netip.MustParseAddr("203.0.113.5")   // cidr.test, "cidr"
)

// HostServiceAddr is where Standard worlds serve "host service" in the
// host namespace, on every address (as the Kiln API might listen).
const HostServiceAddr = "0.0.0.0:8420"

// NewStandard is a world with three sites, the metadata service (answers
// "metadata") and a host service.
func NewStandard(t testing.TB) *World {
	t.Helper()
	w := New(t)
	w.AddSite(t, AllowedSite, "allowed", "allowed.test")
	w.AddSite(t, DeniedSite, "denied", "denied.test", "www.denied.test")
	w.AddSite(t, CIDRSite, "cidr", "cidr.test")
	w.AddSite(t, MetadataAddr, "metadata")
	w.ServeHTTP(t, w.Host, HostServiceAddr, "host service")
	return w
}

// ServeEnv is the environment that runs a kiln serve's sandbox
// networking on this world's host with its DNS (and fails its start if it
// cannot).
func (w *World) ServeEnv() []string {
	return []string{"KILN_NETWORK=on", "KILN_NETWORK_HOST_NS=" + w.Host, "KILN_NETWORK_DNS=" + w.Upstream()[0]}
}

// Standard is NewStandard with a Network on its host, closed when the
// test ends.
func Standard(t testing.TB) (*World, *network.Network) {
	t.Helper()
	w := NewStandard(t)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	n, err := network.New(context.Background(), w.Config(), log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return w, n
}

// RealUplink makes a host namespace of the test's own that is routed
// (masqueraded) to this machine's real network, for the few tests that
// must reach a real server (a Debian mirror): sandbox networking runs
// there (network.Config.HostNS, KILN_NETWORK_HOST_NS) while the
// machine's own "kiln" table, which a kiln serve here may be using, is
// left alone. It needs net.ipv4.ip_forward on the machine, as kiln serve
// does, and leaves it on. Everything else it made goes when the test ends.
func RealUplink(t testing.TB) (ns string) {
	t.Helper()
	ocitest.RequireRoot(t)
	b := make([]byte, 2)
	_, _ = rand.Read(b)
	tag := hex.EncodeToString(b)
	ns, link, table := "kilnt-"+tag+"-up", "kup"+tag, "kilnt_up_"+tag
	// A /30 in the shared address space (RFC 6598) for the link.
	outer := netip.AddrFrom4([4]byte{100, 100 + b[0]%27, b[1], 1})
	inner := outer.Next()
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	t.Cleanup(func() {
		_ = exec.Command("nft", "delete", "table", "ip", table).Run()
		_ = exec.Command("ip", "link", "del", link).Run()
		_ = exec.Command("ip", "netns", "del", ns).Run()
	})
	run("ip", "netns", "add", ns)
	run("ip", "-n", ns, "link", "set", "lo", "up")
	run("ip", "link", "add", link, "type", "veth", "peer", "name", "uplink", "netns", ns)
	run("ip", "addr", "add", outer.String()+"/30", "dev", link)
	run("ip", "link", "set", link, "up")
	run("ip", "-n", ns, "addr", "add", inner.String()+"/30", "dev", "uplink")
	run("ip", "-n", ns, "link", "set", "uplink", "up")
	run("ip", "-n", ns, "route", "add", "default", "via", outer.String())
	run("sysctl", "-qw", "net.ipv4.ip_forward=1")
	rules := fmt.Sprintf(`table ip %s {
	chain forward { type filter hook forward priority 0; policy accept; }
	chain postrouting { type nat hook postrouting priority 100; ip saddr %s/32 oifname != %q masquerade; }
}
`, table, inner, link)
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft: %v: %s", err, out)
	}
	return ns
}
