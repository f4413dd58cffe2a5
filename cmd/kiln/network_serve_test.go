package main

import (
	"bufio"
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/client"
	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/network/nettest"
	"github.com/kiln-sh/kiln/internal/servetest"
)

// TestServeNetwork runs a real kiln serve with networking on, its host
// side in a test namespace (KILN_NETWORK_HOST_NS) with the test's
// internet and DNS (KILN_NETWORK_DNS): a sandbox of mode nat reaches an
// allowed site by name, a denied name does not resolve, the policy changes
// through the CLI's client, and /metrics has the sandbox's network
// counters.
func TestServeNetwork(t *testing.T) {
	requireTemplate(t, "base")
	w := nettest.New(t)
	w.AddSite(t, netip.MustParseAddr("198.51.100.10"), "allowed", "allowed.test")
	w.AddSite(t, netip.MustParseAddr("198.51.100.20"), "denied", "denied.test")
	kiln := buildKiln(t)
	dataDir := servetest.DataDir(t)
	addr := servetest.FreeAddr(t)
	key := serveKey(t, kiln, []string{"KILN_NETWORK_HOST_NS=" + w.Host, "KILN_NETWORK_DNS=" + w.Upstream()[0]},
		"--listen", addr, "--data-dir", dataDir, "--network")
	c := client.New("http://"+addr, key)
	ctx := context.Background()
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Runtime: "runc",
		Network: &api.Network{Mode: "nat", Deny: []string{"denied.test"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.KillSandbox(context.Background(), sb.ID) })
	if sb.Network == nil || sb.Network.Address != "10.11.0.2" {
		t.Fatalf("created network %+v", sb.Network)
	}
	fetch := func(url string) string {
		res, err := c.Output(ctx, sb.ID, api.CommandRequest{Args: []string{"python3", "-c",
			"import sys, urllib.request\ntry:\n print(urllib.request.urlopen(sys.argv[1], timeout=4).read().decode())\nexcept Exception as e:\n print('blocked')", url}})
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(res.Stdout)
	}
	for url, want := range map[string]string{"http://allowed.test/": "allowed", "http://denied.test/": "blocked", "http://198.51.100.20/": "blocked"} {
		if got := fetch(url); got != want {
			t.Errorf("%s: %q, want %q", url, got, want)
		}
	}
	if _, err := c.SetNetwork(ctx, sb.ID, api.Network{Egress: "deny"}); err != nil {
		t.Fatal(err)
	}
	if got := fetch("http://198.51.100.10/"); got != "blocked" {
		t.Errorf("after egress deny: %q", got)
	}
	req, _ := http.NewRequest("GET", "http://"+addr+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var found bool
	for sc := bufio.NewScanner(resp.Body); sc.Scan(); {
		if strings.HasPrefix(sc.Text(), `kiln_sandbox_network_policy_drops_total{sandbox_id="`+sb.ID+`"}`) {
			found = !strings.HasSuffix(sc.Text(), " 0")
		}
	}
	if !found {
		t.Error("/metrics has no non-zero policy drops for the sandbox")
	}
}

// TestOpenNetworkSetup: where the host cannot set networking up (here:
// another Network holds the host namespace), auto runs without it after a
// warning, on and an explicit nat default fail, off never tries.
func TestOpenNetworkSetup(t *testing.T) {
	w, _ := nettest.Standard(t) // its Network holds w.Host
	for _, c := range []struct {
		setup, def string
		wantErr    bool
	}{
		{config.NetworkAuto, "", false},
		{config.NetworkOff, "", false},
		{config.NetworkOn, "", true},
		{config.NetworkAuto, "nat", true},
	} {
		var logs bytes.Buffer
		cfg := config.Default()
		cfg.Network.Setup, cfg.Network.DefaultMode, cfg.Network.HostNS = c.setup, c.def, w.Host
		n, err := openNetwork(context.Background(), cfg, slog.New(slog.NewTextHandler(&logs, nil)))
		if n != nil {
			n.Close()
			t.Errorf("%s/%s: networking set up in a namespace another one holds", c.setup, c.def)
		}
		if (err != nil) != c.wantErr {
			t.Errorf("%s/%s: err %v, want error %v", c.setup, c.def, err, c.wantErr)
		}
		warned := strings.Contains(logs.String(), "sandbox networking is off") && strings.Contains(logs.String(), "another kiln serve")
		if want := c.setup == config.NetworkAuto && !c.wantErr; warned != want {
			t.Errorf("%s/%s: warned %v, want %v: %s", c.setup, c.def, warned, want, logs.String())
		}
	}
}
