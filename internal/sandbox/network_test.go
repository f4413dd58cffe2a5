package sandbox_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/network"
	"github.com/kiln-sh/kiln/internal/network/nettest"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/sandbox/sandboxtest"
)

// probe tries each target from inside a sandbox and prints one JSON
// object: target → response body, or "blocked" / "unresolved".
const probe = `
import json, socket, sys, urllib.request
out = {}
for t in sys.argv[1:]:
    if t.startswith("dns:"):
        try:
            out[t] = socket.gethostbyname(t[4:])
        except OSError:
            out[t] = "unresolved"
        continue
    try:
        out[t] = urllib.request.urlopen(t, timeout=4).read().decode()
    except Exception as e:
        out[t] = "blocked"
print(json.dumps(out))
`

// netWorld is a Standard test world and a Manager using its Network.
func netWorld(t testing.TB) (*nettest.World, *network.Network, *sandbox.Manager) {
	t.Helper()
	w, n, m, _ := netWorldImages(t)
	return w, n, m
}

// netWorldImages is netWorld with the Manager's Images.
func netWorldImages(t testing.TB) (*nettest.World, *network.Network, *sandbox.Manager, *sandbox.Images) {
	t.Helper()
	w, n := nettest.Standard(t)
	cfg := sandboxtest.Config(t, agentPath)
	cfg.Net = n
	m, im := sandboxtest.NewManagerImages(t, cfg)
	return w, n, m, im
}

func probeFrom(t *testing.T, b *sandboxtest.Box, targets ...string) map[string]string {
	t.Helper()
	r, err := b.TryExec(wire.ExecParams{Args: append([]string{"python3", "-c", probe}, targets...), TimeoutMs: 120_000})
	if err != nil {
		t.Fatalf("probe: %v", err)
	}
	var out map[string]string
	if err := json.Unmarshal([]byte(r.Stdout), &out); err != nil {
		t.Fatalf("probe output %q (stderr %q): %v", r.Stdout, r.Stderr, err)
	}
	return out
}

func expect(t *testing.T, got map[string]string, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: got %q, want %q", k, got[k], v)
		}
	}
}

// serveInSandbox starts python's http.server on port in b, in the
// background, and waits until the host can connect to it.
func serveInSandbox(t *testing.T, m *sandbox.Manager, b *sandboxtest.Box, port int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	b.Sh("mkdir -p /tmp/www && echo hello from " + b.SB.ID.String() + " > /tmp/www/index.html")
	go b.Agent.Exec(ctx, wire.ExecParams{Args: []string{"python3", "-m", "http.server", fmt.Sprint(port), "--directory", "/tmp/www"}},
		func(api.Event) error { return nil })
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		c, err := m.DialPort(ctx, b.SB.ID, port)
		if err == nil {
			// The router accepts for the sandbox; a closed port resets.
			_ = c.SetDeadline(time.Now().Add(2 * time.Second))
			fmt.Fprintf(c, "HEAD / HTTP/1.0\r\n\r\n")
			line, err := bufio.NewReader(c).ReadString('\n')
			c.Close()
			if err == nil && strings.HasPrefix(line, "HTTP/") {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("http.server in sandbox never answered on port %d: %v", port, err)
		}
	}
}

func TestSandboxNetwork(t *testing.T) {
	_, n, m := netWorld(t)
	// The host's own loopback service (like the Kiln API on 127.0.0.1).
	api, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { api.Close() })
	go http.Serve(api, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "kiln api") }))
	apiURL := "http://" + api.Addr().String() + "/"

	sandboxtest.ForEachRuntime(t, func(t *testing.T, rt string) {
		nat := func(p network.Policy) sandbox.CreateOptions {
			return sandbox.CreateOptions{Runtime: rt, Network: &sandbox.NetworkOptions{Mode: sandbox.NetworkNAT, Policy: p}}
		}
		a := sandboxtest.Create(t, m, nat(network.Policy{Deny: []string{"denied.test", "203.0.113.0/24"}}))
		neighbour := sandboxtest.Create(t, m, nat(network.Policy{}))
		serveInSandbox(t, m, neighbour, 8080)
		nAddr, err := n.Addr(neighbour.SB.ID.String())
		if err != nil {
			t.Fatal(err)
		}
		neighbourURL := "http://" + nAddr.String() + ":8080/"

		got := probeFrom(t, a, "http://198.51.100.10/", "http://allowed.test/", "dns:denied.test",
			"http://198.51.100.20/", "http://203.0.113.5/", "http://192.0.2.1:8420/", apiURL,
			"http://169.254.169.254/", neighbourURL)
		expect(t, got, map[string]string{
			"http://198.51.100.10/":   "allowed",
			"http://allowed.test/":    "allowed",
			"dns:denied.test":         "unresolved",
			"http://198.51.100.20/":   "blocked", // a denied name's address, used raw
			"http://203.0.113.5/":     "blocked", // denied CIDR
			"http://192.0.2.1:8420/":  "blocked", // the host
			apiURL:                    "blocked", // the host's loopback (the sandbox's own loopback has nothing there)
			"http://169.254.169.254/": "blocked", // link-local metadata
			neighbourURL:              "blocked", // another sandbox
		})

		// Live change: deny everything but one name and the metadata address.
		if _, err := m.SetNetwork(context.Background(), a.SB.ID, sandbox.NetworkOptions{
			Policy: network.Policy{Egress: network.EgressDeny, Allow: []string{"allowed.test", "169.254.169.254/32"}},
		}); err != nil {
			t.Fatal(err)
		}
		got = probeFrom(t, a, "http://allowed.test/", "http://198.51.100.20/", "dns:cidr.test", "http://169.254.169.254/")
		expect(t, got, map[string]string{
			"http://allowed.test/":    "allowed",
			"http://198.51.100.20/":   "blocked",
			"dns:cidr.test":           "unresolved",
			"http://169.254.169.254/": "metadata",
		})
		if info, err := m.Network(a.SB.ID); err != nil || info.Policy.Egress != network.EgressDeny || info.Token == "" {
			t.Errorf("Network = %+v, %v", info, err)
		}
	})
}

// TestSandboxNetworkNone: the default (network none) still has loopback
// only, and asking for nat without a Network is refused.
func TestSandboxNetworkNone(t *testing.T) {
	cfg := sandboxtest.Config(t, agentPath)
	m := sandboxtest.NewManager(t, cfg)
	b := sandboxtest.Create(t, m, sandbox.CreateOptions{Runtime: "runc"})
	r := b.Sh("cat /sys/class/net/*/operstate 2>/dev/null | wc -l; ls /sys/class/net")
	if strings.Contains(r.Stdout, "eth0") {
		t.Errorf("sandbox without network has interfaces: %q", r.Stdout)
	}
	if info, err := m.Network(b.SB.ID); err != nil || info.Mode != sandbox.NetworkNone {
		t.Errorf("Network = %+v, %v; want mode none", info, err)
	}
	_, err := m.Create(context.Background(), sandbox.CreateOptions{Runtime: "runc",
		Network: &sandbox.NetworkOptions{Mode: sandbox.NetworkNAT}})
	if err == nil || !strings.Contains(err.Error(), "no sandbox networking") {
		t.Errorf("create with nat on a server without networking: %v", err)
	}
}

// httpGet fetches / from port of sandbox id through the host side.
func httpGet(t *testing.T, m *sandbox.Manager, id sandbox.ID, port int) string {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return m.DialPort(ctx, id, port) },
	}}
	resp, err := c.Get("http://sandbox/")
	if err != nil {
		t.Fatalf("GET from port %d of %s: %v", port, id, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return strings.TrimSpace(string(b))
}

// networkedRunsc makes a gVisor sandbox with a network that denies one
// CIDR and serves its id on port 8080.
func networkedRunsc(t *testing.T, m *sandbox.Manager) *sandboxtest.Box {
	b := sandboxtest.Create(t, m, sandbox.CreateOptions{Runtime: "runsc",
		Network: &sandbox.NetworkOptions{Mode: sandbox.NetworkNAT, Policy: network.Policy{Deny: []string{"203.0.113.0/24"}}}})
	serveInSandbox(t, m, b, 8080)
	return b
}

var restoredWant = map[string]string{"http://allowed.test/": "allowed", "http://203.0.113.5/": "blocked"}

// TestSandboxNetworkPause: a networked gVisor sandbox keeps its network,
// policy and listening processes across pause (checkpoint) and resume.
func TestSandboxNetworkPause(t *testing.T) {
	_, _, m := netWorld(t)
	ctx := context.Background()
	b := networkedRunsc(t, m)
	if _, err := m.Pause(ctx, b.SB.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Resume(ctx, b.SB.ID); err != nil {
		t.Fatal(err)
	}
	a, err := m.Agent(b.SB.ID)
	if err != nil {
		t.Fatal(err)
	}
	b.Agent = a
	expect(t, probeFrom(t, b, "http://allowed.test/", "http://203.0.113.5/"), restoredWant)
	if got, want := httpGet(t, m, b.SB.ID, 8080), "hello from "+b.SB.ID.String(); got != want {
		t.Errorf("after resume, port 8080 answers %q", got)
	}
}

// TestSandboxNetworkFork: forks of a networked gVisor sandbox come up with
// networks of their own under the same policy, with the source's
// processes still listening (every sandbox has the same inside address,
// so the restored netstacks need no renumbering).
func TestSandboxNetworkFork(t *testing.T) {
	_, n, m, im := netWorldImages(t)
	ctx := context.Background()
	b := networkedRunsc(t, m)
	hello := "hello from " + b.SB.ID.String()
	forks, err := im.Fork(ctx, b.SB.ID, 2, sandbox.Quota{})
	if err != nil {
		t.Fatal(err)
	}
	addrs := map[string]bool{}
	for _, f := range forks {
		t.Cleanup(func() { _ = m.Kill(context.Background(), f.ID) })
		fa, err := m.Agent(f.ID)
		if err != nil {
			t.Fatal(err)
		}
		expect(t, probeFrom(t, &sandboxtest.Box{M: m, SB: f, Agent: fa}, "http://allowed.test/", "http://203.0.113.5/"), restoredWant)
		if got := httpGet(t, m, f.ID, 8080); got != hello {
			t.Errorf("fork %s: port 8080 answers %q", f.ID, got)
		}
		info, err := m.Network(f.ID)
		if err != nil || info.Mode != sandbox.NetworkNAT || len(info.Policy.Deny) != 1 {
			t.Errorf("fork network = %+v, %v", info, err)
		}
		addr, _ := n.Addr(f.ID.String())
		addrs[addr.String()] = true
	}
	if len(addrs) != 2 {
		t.Errorf("forks share outer addresses: %v", addrs)
	}
}

// TestSandboxNetworkReadopt: after kiln serve restarts (a new Network and
// a Manager with Adopt on the same state), a networked sandbox keeps its
// address, policy and DNS (whose port changed), and killing it then
// removes its namespaces.
func TestSandboxNetworkReadopt(t *testing.T) {
	w, n1 := nettest.Standard(t)
	cfg := sandboxtest.Config(t, agentPath)
	cfg.Adopt, cfg.Net = true, n1
	m1, err := sandbox.NewManager(context.Background(), cfg, sandboxtest.OCIRuntimes(cfg.Config), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	sb, err := m1.Create(context.Background(), sandbox.CreateOptions{Runtime: "runc",
		Network: &sandbox.NetworkOptions{Mode: sandbox.NetworkNAT, Policy: network.Policy{Deny: []string{"denied.test"}},
			MaskHost: "app.internal:${PORT}"}})
	if err != nil {
		t.Fatal(err)
	}
	m1.Close()
	if err := n1.Close(); err != nil {
		t.Fatal(err)
	}
	n2, err := network.New(context.Background(), w.Config(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n2.Close() })
	cfg.Net = n2
	m2 := sandboxtest.NewManager(t, cfg)
	a, err := m2.Agent(sb.ID)
	if err != nil {
		t.Fatalf("not re-adopted: %v", err)
	}
	if info, err := m2.Network(sb.ID); err != nil || info.MaskHost != "app.internal:${PORT}" || info.Policy.Deny[0] != "denied.test" {
		t.Errorf("network after re-adopt: %+v, %v; want the mask host and policy kept", info, err)
	}
	b := &sandboxtest.Box{M: m2, SB: sb, Agent: a}
	expect(t, probeFrom(t, b, "http://allowed.test/", "dns:denied.test", "http://198.51.100.20/"), map[string]string{
		"http://allowed.test/": "allowed", "dns:denied.test": "unresolved", "http://198.51.100.20/": "blocked",
	})
	if err := m2.Kill(context.Background(), sb.ID); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{network.SandboxNS(sb.ID.String()), network.SandboxNS(sb.ID.String()) + "-gw"} {
		if _, err := os.Stat(network.NSPath(ns)); err == nil {
			t.Errorf("namespace %s left after kill", ns)
		}
	}
}

// TestSandboxNetworkPausedReboot: a paused networked gVisor sandbox
// survives a reboot of the host, which takes its namespaces and mounts:
// kiln serve makes its network again in the same slot, and it resumes
// with its policy and its listening process.
func TestSandboxNetworkPausedReboot(t *testing.T) {
	requireRunsc(t)
	w, n1 := nettest.Standard(t)
	cfg := sandboxtest.Config(t, agentPath)
	cfg.Adopt, cfg.Net = true, n1
	m1, err := sandbox.NewManager(context.Background(), cfg, sandboxtest.OCIRuntimes(cfg.Config), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	b := networkedRunsc(t, m1)
	if _, err := m1.Pause(context.Background(), b.SB.ID); err != nil {
		t.Fatal(err)
	}
	slot, _ := n1.State(b.SB.ID.String())
	m1.Close()
	if err := n1.Close(); err != nil {
		t.Fatal(err)
	}
	// The reboot.
	ctx := context.Background()
	if err := network.Remove(ctx, b.SB.ID.String()); err != nil {
		t.Fatal(err)
	}
	layer := filepath.Join(cfg.StateDir, b.SB.ID.String(), "layer")
	for _, mnt := range []string{"rootfs", "layer"} {
		if out, err := exec.Command("umount", filepath.Join(layer, mnt)).CombinedOutput(); err != nil {
			t.Fatalf("umount %s: %v %s", mnt, err, out)
		}
	}

	n2, err := network.New(ctx, w.Config(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n2.Close() })
	cfg.Net = n2
	m2 := sandboxtest.NewManager(t, cfg)
	if _, err := m2.Resume(ctx, b.SB.ID); err != nil {
		t.Fatalf("resume after reboot: %v", err)
	}
	if st, err := n2.State(b.SB.ID.String()); err != nil || st.Slot != slot.Slot {
		t.Errorf("network after reboot: %+v %v, want slot %d", st, err, slot.Slot)
	}
	a, err := m2.Agent(b.SB.ID)
	if err != nil {
		t.Fatal(err)
	}
	b2 := sandboxtest.Wrap(t, m2, b.SB, a)
	expect(t, probeFrom(t, b2, "http://allowed.test/", "http://203.0.113.5/"), restoredWant)
	if got, want := httpGet(t, m2, b.SB.ID, 8080), "hello from "+b.SB.ID.String(); got != want {
		t.Errorf("after reboot and resume, port 8080 answers %q", got)
	}
}

// TestSandboxNetworkWarm: a networked (nat) sandbox of a template with a
// warm checkpoint, which is made without a network, restores it instead
// of booting cold, and has its network: runsc's restore takes the
// namespace's eth0 with its address and route.
func TestSandboxNetworkWarm(t *testing.T) {
	requireRunsc(t)
	_, n := nettest.Standard(t)
	cfg := testConfig(t)
	requireCodeInterpreter(t, cfg)
	cfg.Net = n
	m, im, logs := newLoggedManager(t, cfg, runtimes(cfg.Config))
	buildWarm(t, im)
	e := create(t, m, sandbox.CreateOptions{Template: codeInterpreter, Runtime: "runsc"}) // nat: the default with networking
	if !strings.Contains(logs.String(), `from="warm checkpoint"`) {
		t.Error("the networked sandbox did not restore the warm checkpoint")
	}
	if info, err := m.Network(e.SB.ID); err != nil || info.Mode != sandbox.NetworkNAT {
		t.Fatalf("network %+v, %v; want nat", info, err)
	}
	got := probeFrom(t, e, "http://allowed.test/", "http://"+nettest.MetadataAddr.String()+"/")
	expect(t, got, map[string]string{"http://allowed.test/": "allowed", "http://" + nettest.MetadataAddr.String() + "/": "blocked"})
	if _, r := e.Py(pandasLoaded); r != "True" {
		t.Errorf("pandas loaded = %s, want True (a warm kernel)", r)
	}
}

// A pool on a networked server holds sandboxes with the network a create
// that does not ask gets (nat): a default create claims one and reaches
// the internet; a create with a closed policy claims one too and is closed
// before it is handed out; a create without a network misses; the pooled
// sandboxes' networks go with them.
func TestPoolNetwork(t *testing.T) {
	requireRunsc(t)
	_, n := nettest.Standard(t)
	cfg := testConfig(t)
	requireCodeInterpreter(t, cfg)
	cfg.Net = n
	m, im, _ := newLoggedManager(t, cfg, runtimes(cfg.Config))
	buildWarm(t, im)
	im.StartPools(map[string]int{codeInterpreter: 1})
	waitPool(t, im, codeInterpreter, 1)
	if got := n.Attached(); len(got) != 1 {
		t.Fatalf("networks attached with one pooled sandbox: %v", got)
	}

	open := create(t, m, sandbox.CreateOptions{Template: codeInterpreter})
	st := waitPool(t, im, codeInterpreter, 1)
	closed := create(t, m, sandbox.CreateOptions{Template: codeInterpreter, Network: &sandbox.NetworkOptions{
		Policy: network.Policy{Egress: network.EgressDeny, Allow: []string{"198.51.100.10/32"}}, MaskHost: "app.test"}})
	if st2 := waitPool(t, im, codeInterpreter, 1); st2.Hits != st.Hits+1 || st.Hits != 1 || st2.Misses != 0 {
		t.Errorf("pool stats after two networked creates: %+v then %+v, want a hit each", st, st2)
	}
	expect(t, probeFrom(t, open, "http://allowed.test/", "http://169.254.169.254/"),
		map[string]string{"http://allowed.test/": "allowed", "http://169.254.169.254/": "blocked"})
	expect(t, probeFrom(t, closed, "http://198.51.100.10/", "http://198.51.100.20/"),
		map[string]string{"http://198.51.100.10/": "allowed", "http://198.51.100.20/": "blocked"})
	if info, err := m.Network(closed.SB.ID); err != nil || info.Policy.Egress != network.EgressDeny || info.MaskHost != "app.test" {
		t.Errorf("claimed sandbox's network: %+v, %v", info, err)
	}
	if _, r := closed.Py(pandasLoaded); r != "True" {
		t.Errorf("pandas loaded = %s in a pooled networked sandbox, want True (warm)", r)
	}

	none := create(t, m, sandbox.CreateOptions{Template: codeInterpreter, Network: &sandbox.NetworkOptions{Mode: sandbox.NetworkNone}})
	if info, err := m.Network(none.SB.ID); err != nil || info.Mode != sandbox.NetworkNone {
		t.Errorf("a create asking for no network got %+v, %v", info, err)
	}
	if st := waitPool(t, im, codeInterpreter, 1); st.Misses != 1 {
		t.Errorf("pool stats after a create without a network: %+v, want one miss", st)
	}

	ctx := context.Background()
	for _, e := range []*sandboxtest.Box{open, closed, none} {
		if err := m.Kill(ctx, e.SB.ID); err != nil {
			t.Fatal(err)
		}
	}
	pooled, _ := stateDirs(cfg)
	m.Close()
	assertPoolGone(t, cfg, pooled)
	if got := n.Attached(); len(got) != 0 {
		t.Errorf("networks left after Close: %v", got)
	}
	for _, id := range pooled {
		if _, err := os.Stat(network.NSPath(network.SandboxNS(id))); err == nil {
			t.Errorf("network namespace of pooled sandbox %s left", id)
		}
	}
}
