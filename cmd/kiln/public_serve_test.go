package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/client"
	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/servetest"
)

// serveKey starts `kiln serve args...` with env added to this process's
// (its sandbox networking in t's test world unless env names a host
// namespace), stops it when the test ends (logging its log if the test
// failed), and returns the admin key it prints on its first start.
func serveKey(t *testing.T, kiln string, env []string, args ...string) string {
	t.Helper()
	if !slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "KILN_NETWORK_HOST_NS=") }) {
		env = append(servetest.NetEnv(t), env...)
	}
	p := servetest.StartArgs(t, kiln, "kiln serve", env, args...)
	t.Cleanup(func() { p.Stop(t) })
	return p.AdminKey(t)
}

func TestPublicListenerBadCert(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.pem")
	if err := os.WriteFile(bad, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []config.Public{{TLSCert: bad, TLSKey: bad}, {TLSCert: filepath.Join(dir, "none"), TLSKey: bad}} {
		if _, err := publicListener(ln, p); err == nil || !strings.Contains(err.Error(), "TLS certificate") {
			t.Errorf("%+v: %v, want an error about the TLS certificate", p, err)
		}
	}
}

func TestSandboxDomain(t *testing.T) {
	addr := &net.TCPAddr{IP: net.IPv4(0, 0, 0, 0), Port: 8420}
	for _, tc := range []struct {
		p    config.Public
		want string
	}{
		{config.Public{}, "localhost:8420"},
		{config.Public{TLSCert: "c", TLSKey: "k"}, "localhost:8420"},
		{config.Public{Domain: "sandboxes.example.com"}, "sandboxes.example.com"},
	} {
		if got := sandboxDomain(tc.p, addr); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.p, got, tc.want)
		}
	}
}

// TestServeTLSDomain runs a real kiln serve with --tls-cert/--tls-key and
// --domain: the API answers over HTTPS only, E2B's create and connect
// return the domain, and https://8000-<id>.<domain> (the URL the SDKs'
// getHost(8000) makes) reaches a server in the sandbox; hosts under the
// domain that name no sandbox port get 404, an unknown sandbox E2B's 502,
// and the server keeps serving.
func TestServeTLSDomain(t *testing.T) {
	requireTemplate(t, "base")
	const domain = "sandboxes.kiln.test"
	certFile, keyFile, pool := servetest.SelfSigned(t, t.TempDir(), "kiln.test", "*."+domain)
	kiln := buildKiln(t)
	addr := servetest.FreeAddr(t)
	key := serveKey(t, kiln, nil, "--listen", addr, "--data-dir", servetest.DataDir(t),
		"--tls-cert", certFile, "--tls-key", keyFile, "--domain", domain)
	// Every name resolves to the server, as wildcard DNS would.
	hc := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		},
	}}
	_, port, _ := net.SplitHostPort(addr)
	call := func(method, url string, body any, hdr ...string) (int, []byte) {
		t.Helper()
		var rd io.Reader
		if body != nil {
			b, _ := json.Marshal(body)
			rd = bytes.NewReader(b)
		}
		req, err := http.NewRequest(method, url, rd)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, url, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	api2 := "https://kiln.test:" + port

	// HTTPS only: a plain HTTP request is refused.
	if resp, err := http.Get("http://" + addr + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Errorf("plain HTTP on a TLS server: %s", resp.Status)
		}
	}
	if st, b := call("GET", api2+"/healthz", nil); st != http.StatusOK {
		t.Fatalf("GET /healthz over HTTPS: %d %s", st, b)
	}

	var sb struct {
		SandboxID          string  `json:"sandboxID"`
		TrafficAccessToken string  `json:"trafficAccessToken"`
		Domain             *string `json:"domain"`
	}
	st, b := call("POST", api2+"/v2/sandboxes", map[string]any{"templateID": "base"}, "X-API-Key", key)
	if st != http.StatusCreated || json.Unmarshal(b, &sb) != nil {
		t.Fatalf("create: %d %s", st, b)
	}
	c := client.New(api2, key, client.WithHTTPClient(hc))
	t.Cleanup(func() { _ = c.KillSandbox(context.Background(), sb.SandboxID) })
	if sb.Domain == nil || *sb.Domain != domain {
		t.Errorf("create: domain %v, want %q", sb.Domain, domain)
	}
	st, b = call("POST", api2+"/v2/sandboxes/"+sb.SandboxID+"/connect", map[string]any{"timeout": 300}, "X-API-Key", key)
	if st != http.StatusOK || !bytes.Contains(b, []byte(`"domain":"`+domain+`"`)) {
		t.Errorf("connect: %d %s, want domain %q", st, b, domain)
	}

	ctx := context.Background()
	if _, err := c.Start(ctx, sb.SandboxID, api.CommandRequest{Args: []string{"python3", "-m", "http.server", "8000"}, Cwd: "/etc"}); err != nil {
		t.Fatal(err)
	}
	host := fmt.Sprintf("https://8000-%s.%s:%s", sb.SandboxID, domain, port)
	deadline := time.Now().Add(60 * time.Second)
	for {
		st, b = call("GET", host+"/hostname", nil, "E2B-Traffic-Access-Token", sb.TrafficAccessToken)
		if st == http.StatusOK || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if st != http.StatusOK || len(bytes.TrimSpace(b)) == 0 {
		t.Fatalf("GET %s/hostname: %d %s", host, st, b)
	}

	for _, tc := range []struct {
		url    string
		status int
	}{
		{fmt.Sprintf("https://www.%s:%s/", domain, port), http.StatusNotFound},
		{fmt.Sprintf("https://99999-%s.%s:%s/", sb.SandboxID, domain, port), http.StatusNotFound},
		{fmt.Sprintf("https://8000-no_such.%s:%s/v1/sandboxes", domain, port), http.StatusNotFound},
		{fmt.Sprintf("https://8000-nosuchsandbox1.%s:%s/", domain, port), http.StatusBadGateway},
		{api2 + "/healthz", http.StatusOK},
	} {
		if st, b := call("GET", tc.url, nil, "X-API-Key", key); st != tc.status {
			t.Errorf("GET %s: %d %s, want %d", tc.url, st, b, tc.status)
		}
	}
}
