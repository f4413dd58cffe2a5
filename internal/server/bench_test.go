package server_test

import (
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// BenchmarkExec measures the API's overhead on the command round trip:
// `true` through Agent.Exec directly, and through HTTP as a stream and as
// an aggregated JSON result.
func BenchmarkExec(b *testing.B) {
	h := newHarness(b, true, harnessOpts{})
	sb := h.create(h.a, api.CreateSandboxRequest{})
	path := "/v1/sandboxes/" + sb.ID + "/commands"
	body := `{"args":["true"]}`

	b.Run("direct", func(b *testing.B) {
		a, err := h.m.Agent(sandbox.ID(sb.ID))
		if err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			exit, err := a.Exec(context.Background(), wire.ExecParams{Args: []string{"true"}, User: "user", TimeoutMs: 60000}, func(api.Event) error { return nil })
			if err != nil || exit.Code != 0 {
				b.Fatal(exit, err)
			}
		}
	})
	b.Run("http-stream", func(b *testing.B) {
		h := h.withTB(b)
		for b.Loop() {
			resp := h.request("POST", path, h.a, strings.NewReader(body))
			n, _ := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || n == 0 {
				b.Fatal(resp.StatusCode)
			}
		}
	})
	b.Run("http-json", func(b *testing.B) {
		h := h.withTB(b)
		for b.Loop() {
			resp := h.request("POST", path, h.a, strings.NewReader(body), "Accept", "application/json")
			var res api.CommandResult
			err := json.NewDecoder(resp.Body).Decode(&res)
			resp.Body.Close()
			if err != nil || res.Exit.Code != 0 {
				b.Fatal(err, res)
			}
		}
	})
}
