package proxy_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// BenchmarkPortProxy reports the round trip of a small GET (median of 200,
// keep-alive) and the throughput of a 16 MiB download from a Python
// http.server in a gVisor sandbox: through the API server's exposed-port
// proxy (E2B host routing, traffic token), and straight to the sandbox's
// address from the host side as the baseline.
//
//	go test -run '^$' -bench PortProxy -benchtime 1x ./internal/proxy/
func BenchmarkPortProxy(b *testing.B) {
	e := newEnv(b)
	sb := e.create(api.CreateSandboxRequest{Runtime: "runsc", Network: &api.Network{Mode: "nat"}})
	a, err := e.m.Agent(sandbox.ID(sb.ID))
	if err != nil {
		b.Fatal(err)
	}
	if _, err := a.Exec(context.Background(), wire.ExecParams{Cmd: "mkdir /tmp/www && head -c 16777216 /dev/zero > /tmp/www/big && echo ok > /tmp/www/small && echo ok > /tmp/www/index.html",
		TimeoutMs: 60_000}, func(api.Event) error { return nil }); err != nil {
		b.Fatal(err)
	}
	e.start(sb.ID, 8080, "python3", "-m", "http.server", "8080", "--directory", "/tmp/www")

	direct := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return e.m.DialPort(ctx, sandbox.ID(sb.ID), 8080)
	}}}
	for _, c := range []struct {
		name   string
		client *http.Client
		base   string
		host   string
	}{
		{"direct", direct, "http://sandbox", ""},
		{"proxy", &http.Client{Transport: &http.Transport{}}, e.url, fmt.Sprintf("8080-%s.kiln.test", sb.ID)},
	} {
		b.Run(c.name, func(b *testing.B) {
			get := func(path string) int64 {
				r, _ := http.NewRequest("GET", c.base+path, nil)
				if c.host != "" {
					r.Host = c.host
					r.Header.Set("E2B-Traffic-Access-Token", sb.Network.TrafficToken)
				}
				resp, err := c.client.Do(r)
				if err != nil {
					b.Fatal(err)
				}
				n, _ := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Fatalf("GET %s: %s", path, resp.Status)
				}
				return n
			}
			var rtts []time.Duration
			var mibs float64
			for b.Loop() {
				rtts = rtts[:0]
				for range 200 {
					t0 := time.Now()
					get("/small")
					rtts = append(rtts, time.Since(t0))
				}
				t0, n := time.Now(), int64(0)
				for range 4 {
					n += get("/big")
				}
				mibs = float64(n) / (1 << 20) / time.Since(t0).Seconds()
			}
			slices.Sort(rtts)
			b.ReportMetric(float64(rtts[len(rtts)/2].Microseconds())/1000, "rtt-ms")
			b.ReportMetric(mibs, "MiB/s")
		})
	}
}
