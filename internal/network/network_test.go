package network_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/internal/network"
	"github.com/kiln-sh/kiln/internal/network/nettest"
)

// world is a Standard test world and its Network.
func world(t *testing.T) (*nettest.World, *network.Network) { return nettest.Standard(t) }

func newID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "t" + hex.EncodeToString(b)
}

func attach(t *testing.T, n *network.Network, p network.Policy) string {
	t.Helper()
	id := newID()
	if _, err := n.Attach(context.Background(), id, p, network.Exposure{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Detach(context.Background(), id); err != nil {
			t.Error(err)
		}
	})
	return id
}

// lookup resolves name through the sandbox's resolver (the gateway), from
// inside its namespace.
func lookup(ctx context.Context, ns, name string) ([]netip.Addr, error) {
	return lookupOver(ctx, ns, "", name)
}

// lookupOver is lookup over network nw ("tcp"; "" lets the resolver pick).
func lookupOver(ctx context.Context, ns, nw, name string) ([]netip.Addr, error) {
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, picked, _ string) (net.Conn, error) {
		if nw == "" {
			nw = picked
		}
		return network.DialIn(ctx, ns, nw, netip.AddrPortFrom(network.GatewayAddr, 53).String())
	}}
	return r.LookupNetIP(ctx, "ip4", name)
}

// TestDNSOverTCP: the resolver answers and filters over TCP too.
func TestDNSOverTCP(t *testing.T) {
	_, n := world(t)
	ctx := context.Background()
	ns := network.SandboxNS(attach(t, n, network.Policy{Deny: []string{"denied.test"}}))
	if got, err := lookupOver(ctx, ns, "tcp", "allowed.test"); err != nil || len(got) != 1 || got[0] != nettest.AllowedSite {
		t.Errorf("lookup allowed.test over TCP = %v, %v", got, err)
	}
	if got, err := lookupOver(ctx, ns, "tcp", "denied.test"); err == nil {
		t.Errorf("lookup denied.test over TCP = %v, want refused", got)
	}
}

type check struct {
	name string
	url  string // fetched from the sandbox; want "" = must fail
	want string
}

func runChecks(t *testing.T, ns string, checks []check) {
	t.Helper()
	ctx := context.Background()
	for _, c := range checks {
		body, err := nettest.Get(ctx, ns, c.url)
		switch {
		case c.want == "" && err == nil:
			t.Errorf("%s: %s reachable (%q), want blocked", c.name, c.url, body)
		case c.want != "" && err != nil:
			t.Errorf("%s: %s: %v, want %q", c.name, c.url, err, c.want)
		case c.want != "" && body != c.want:
			t.Errorf("%s: %s = %q, want %q", c.name, c.url, body, c.want)
		}
	}
}

func TestPolicy(t *testing.T) {
	w, n := world(t)
	ctx := context.Background()
	a := attach(t, n, network.Policy{Deny: []string{"denied.test", "203.0.113.0/24"}})
	b := attach(t, n, network.Policy{})
	nettestServe(t, network.SandboxNS(b), "neighbour")
	bAddr, err := n.Addr(b)
	if err != nil {
		t.Fatal(err)
	}
	ns := network.SandboxNS(a)

	t.Run("default", func(t *testing.T) {
		runChecks(t, ns, []check{
			{"allowed by default", "http://198.51.100.10/", "allowed"},
			{"denied domain by raw IP", "http://198.51.100.20/", ""},
			{"denied CIDR", "http://203.0.113.5/", ""},
			{"host uplink address", "http://192.0.2.1:8420/", ""},
			{"host side of the sandbox link", "http://10.200.0.1:8420/", ""},
			{"link-local metadata", "http://169.254.169.254/", ""},
			{"neighbour sandbox", "http://" + bAddr.String() + ":8080/", ""},
		})
		if got, err := lookup(ctx, ns, "allowed.test"); err != nil || len(got) != 1 || got[0] != nettest.AllowedSite {
			t.Errorf("lookup allowed.test = %v, %v", got, err)
		}
		for _, name := range []string{"denied.test", "www.denied.test"} {
			if got, err := lookup(ctx, ns, name); err == nil {
				t.Errorf("lookup %s = %v, want refused", name, got)
			}
		}
	})
	t.Run("host reaches sandbox", func(t *testing.T) {
		c, err := n.Dial(ctx, b, 8080)
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
	})
	t.Run("outside cannot reach sandbox", func(t *testing.T) {
		// Even with a route to the pool, the internet cannot open a
		// connection to a sandbox's outer address.
		if out, err := exec.Command("ip", "-n", w.Internet, "route", "add", network.DefaultPool.String(), "via", nettest.HostAddr.String()).CombinedOutput(); err != nil {
			t.Fatalf("route: %v: %s", err, out)
		}
		dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if c, err := network.DialIn(dctx, w.Internet, "tcp4", netip.AddrPortFrom(bAddr, 8080).String()); err == nil {
			c.Close()
			t.Error("the internet opened a connection to a sandbox")
		}
	})
	t.Run("changed live", func(t *testing.T) {
		if _, err := n.SetPolicy(ctx, a, network.Policy{Egress: network.EgressDeny,
			Allow: []string{"allowed.test", "169.254.169.254"}}, network.Exposure{}); err != nil {
			t.Fatal(err)
		}
		runChecks(t, ns, []check{
			{"allowed domain by its IP", "http://198.51.100.10/", "allowed"},
			{"explicitly allowed metadata", "http://169.254.169.254/", "metadata"},
			{"not listed, default deny", "http://203.0.113.5/", ""},
			{"no longer denied but not allowed", "http://198.51.100.20/", ""},
			{"host still protected", "http://192.0.2.1:8420/", ""},
		})
		if _, err := lookup(ctx, ns, "cidr.test"); err == nil {
			t.Error("lookup of an unlisted name answered under default deny")
		}
		if got, err := lookup(ctx, ns, "allowed.test"); err != nil || len(got) != 1 {
			t.Errorf("lookup allowed.test = %v, %v", got, err)
		}
	})
	t.Run("stats", func(t *testing.T) {
		st, err := n.Stats(ctx, a)
		if err != nil {
			t.Fatal(err)
		}
		if st.SentBytes == 0 || st.ReceivedBytes == 0 || st.Drops == 0 || st.Connections == 0 {
			t.Errorf("stats = %+v, want all counters moving", st)
		}
	})
}

// TestDNSLearnsAllowedNames: under default deny, an allowed name whose
// address was not known when the policy was set becomes reachable once the
// sandbox resolves it.
func TestDNSLearnsAllowedNames(t *testing.T) {
	w, n := world(t)
	ctx := context.Background()
	a := attach(t, n, network.Policy{Egress: network.EgressDeny, Allow: []string{"late.test"}})
	ns := network.SandboxNS(a)
	late := netip.MustParseAddr("198.51.100.30")
	w.AddSite(t, late, "late", "late.test")
	runChecks(t, ns, []check{{"before resolving", "http://198.51.100.30/", ""}})
	if got, err := lookup(ctx, ns, "late.test"); err != nil || len(got) != 1 || got[0] != late {
		t.Fatalf("lookup late.test = %v, %v", got, err)
	}
	runChecks(t, ns, []check{{"after resolving", "http://198.51.100.30/", "late"}})
}

func TestConnectionLimit(t *testing.T) {
	_, n := world(t)
	ctx := context.Background()
	a := attach(t, n, network.Policy{MaxConnections: 2})
	ns := network.SandboxNS(a)
	var open []net.Conn
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()
	for i := range 3 {
		dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		c, err := network.DialIn(dctx, ns, "tcp4", "198.51.100.10:80")
		cancel()
		if i < 2 {
			if err != nil {
				t.Fatalf("connection %d: %v", i+1, err)
			}
			open = append(open, c)
			continue
		}
		if err == nil {
			c.Close()
			t.Fatal("third connection opened over a limit of 2")
		}
	}
	open[0].Close()
	open = open[1:]
	// A closed connection frees its place (conntrack sees the FIN).
	var err error
	for range 20 {
		var c net.Conn
		if c, err = network.DialIn(ctx, ns, "tcp4", "198.51.100.10:80"); err == nil {
			open = append(open, c)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("connection after closing one: %v", err)
	}
}

func TestPolicyValidation(t *testing.T) {
	for _, p := range []network.Policy{
		{Egress: "maybe"},
		{Allow: []string{"::1/128"}},
		{Deny: []string{"not a name"}},
		{Deny: []string{"localhost"}},
		{BandwidthBytes: -1},
		{MaxConnections: -1},
		{Allow: []string{strings.Repeat("a.", 200) + "com"}},
	} {
		if err := p.Validate(); err == nil {
			t.Errorf("Validate(%+v) = nil, want error", p)
		}
	}
	p := network.Policy{Allow: []string{"Example.COM.", "10.0.0.1", "*.x.test"}}
	if err := p.Validate(); err != nil || p.Egress != network.EgressAllow || p.Allow[0] != "example.com" {
		t.Errorf("Validate = %v, policy %+v", err, p)
	}
}

func nettestServe(t *testing.T, ns, body string) {
	t.Helper()
	(&nettest.World{}).ServeHTTP(t, ns, "0.0.0.0:8080", body)
}

// BenchmarkAttach measures making and removing one sandbox's network.
//
//	go test -run '^$' -bench Attach ./internal/network/
func BenchmarkAttach(b *testing.B) {
	_, n := nettest.Standard(b)
	ctx := context.Background()
	var attach, detach time.Duration
	for b.Loop() {
		id := newID()
		t0 := time.Now()
		if _, err := n.Attach(ctx, id, network.Policy{Deny: []string{"203.0.113.0/24"}}, network.Exposure{}); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := n.Detach(ctx, id); err != nil {
			b.Fatal(err)
		}
		attach, detach = attach+t1.Sub(t0), detach+time.Since(t1)
	}
	b.ReportMetric(float64(attach.Milliseconds())/float64(b.N), "attach-ms")
	b.ReportMetric(float64(detach.Milliseconds())/float64(b.N), "detach-ms")
}
