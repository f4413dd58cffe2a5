package sandbox_test

import (
	"encoding/json"
	"os/exec"
	"testing"

	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/network"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/sandbox/sandboxtest"
)

// natLoad measures, from inside a sandbox, the round trip of a small HTTP
// request on a new connection (median of 50) and the throughput of 16 MiB
// downloads from a site in the test's internet.
const natLoad = `
import json, socket, statistics, time
def get(path, bufsize):
    s = socket.create_connection(("198.51.100.10", 80), timeout=10)
    s.sendall(("GET %s HTTP/1.0\r\nHost: x\r\n\r\n" % path).encode())
    n, buf = 0, bytearray(bufsize)
    while True:
        k = s.recv_into(buf)
        if not k:
            break
        n += k
    s.close()
    return n
rtts = []
for _ in range(50):
    t = time.perf_counter(); get("/", 4096); rtts.append((time.perf_counter() - t) * 1000)
t, n = time.perf_counter(), 0
for _ in range(4):
    n += get("/bytes", 1 << 20)
print(json.dumps({"rtt_ms": statistics.median(rtts), "mib_s": n / (1 << 20) / (time.perf_counter() - t)}))
`

// BenchmarkSandboxNAT reports latency and throughput from a sandbox
// through its router's NAT and the host's to the test internet, per
// runtime, and with a 5 MiB/s bandwidth limit.
//
//	go test -run '^$' -bench SandboxNAT -benchtime 1x ./internal/sandbox/
func BenchmarkSandboxNAT(b *testing.B) {
	w, _, m := netWorld(b)
	b.Run("host-baseline", func(b *testing.B) {
		// The same load from the host namespace itself: no sandbox, no NAT.
		var out []byte
		for b.Loop() {
			var err error
			if out, err = exec.Command("nsenter", "--net="+network.NSPath(w.Host), "/usr/bin/python3", "-c", natLoad).Output(); err != nil {
				b.Fatal(err)
			}
		}
		reportLoad(b, out)
	})
	for _, c := range []struct {
		name, runtime string
		bandwidth     int64
	}{{"runsc", "runsc", 0}, {"runc", "runc", 0}, {"runsc-5MiB/s", "runsc", 5 << 20}} {
		b.Run(c.name, func(b *testing.B) {
			box := sandboxtest.Create(b, m, sandbox.CreateOptions{Runtime: c.runtime, Network: &sandbox.NetworkOptions{
				Mode: sandbox.NetworkNAT, Policy: network.Policy{BandwidthBytes: c.bandwidth}}})
			var out string
			for b.Loop() {
				out = box.Exec(wire.ExecParams{Args: []string{"python3", "-c", natLoad}, TimeoutMs: 300_000}).Stdout
			}
			reportLoad(b, []byte(out))
		})
	}
}

func reportLoad(b *testing.B, out []byte) {
	var res struct {
		RTT  float64 `json:"rtt_ms"`
		MiBs float64 `json:"mib_s"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		b.Fatalf("load output %q: %v", out, err)
	}
	b.ReportMetric(res.RTT, "rtt-ms")
	b.ReportMetric(res.MiBs, "MiB/s")
}
