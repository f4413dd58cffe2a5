package envd_test

import (
	"bytes"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"

	"github.com/kiln-sh/kiln/internal/e2b/envd/spec/filesystem"
	"github.com/kiln-sh/kiln/internal/e2b/envd/spec/process"
)

// BenchmarkEnvd measures envd calls as the SDKs make them (JSON codec,
// over HTTP/1.1 on loopback) against a real sandbox: what E2B users pay
// per call on Kiln.
func BenchmarkEnvd(b *testing.B) {
	e := newEnv(b, sandboxOpts())
	pc := e.process("", codecs[0].opts)
	fs := e.filesystem("", codecs[0].opts)
	payload := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	b.Run("commands.run true", func(b *testing.B) {
		for b.Loop() {
			s, err := pc.Start(ctxTimeout(b, time.Minute), connect.NewRequest(&process.StartRequest{Process: bash("true"), Stdin: ptr(false)}))
			if err != nil {
				b.Fatal(err)
			}
			for s.Receive() {
			}
			if err := s.Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
	// The same process without envd: the Agent call envd makes.
	b.Run("Agent.Exec bash -l -c true", func(b *testing.B) {
		a, err := e.m.Agent(e.sb.ID)
		if err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if _, err := a.Exec(ctxTimeout(b, time.Minute), wire.ExecParams{Args: []string{"/bin/bash", "-l", "-c", "true"}},
				func(api.Event) error { return nil }); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("files.getInfo", func(b *testing.B) {
		for b.Loop() {
			if _, err := fs.Stat(ctxTimeout(b, time.Minute), connect.NewRequest(&filesystem.StatRequest{Path: "/etc/passwd"})); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Agent.Stat", func(b *testing.B) {
		a, err := e.m.Agent(e.sb.ID)
		if err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if _, err := a.Stat(ctxTimeout(b, time.Minute), wire.PathParams{Path: "/etc/passwd", XattrPrefix: "user.e2b."}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("files.write 1MiB", func(b *testing.B) {
		b.SetBytes(int64(len(payload)))
		for b.Loop() {
			res, body := e.do(b, "POST", "/files?path=bench.bin", map[string]string{"X-Access-Token": e.token, "Content-Type": "application/octet-stream"}, bytes.NewReader(payload))
			if res.StatusCode != http.StatusOK {
				b.Fatalf("%d %s", res.StatusCode, body)
			}
		}
	})
	b.Run("files.read 1MiB", func(b *testing.B) {
		b.SetBytes(int64(len(payload)))
		for b.Loop() {
			res, body := e.do(b, "GET", "/files?path=bench.bin", map[string]string{"X-Access-Token": e.token}, nil)
			if res.StatusCode != http.StatusOK || len(body) != len(payload) {
				b.Fatalf("%d, %d bytes", res.StatusCode, len(body))
			}
		}
	})
}
