package e2b_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// E2B's POST /contexts with a cwd the sandbox's user cannot enter answers
// 403 in every language, and the sandbox stays usable: python and R used
// to panic the agent (the sandbox died), javascript and bash answered 503.
func TestContextCwdRefused(t *testing.T) {
	h := newHarness(t, "code-interpreter")
	sb := h.create(h.a, map[string]any{"templateID": "code-interpreter"})
	a, err := h.m.Agent(sandbox.ID(sb.SandboxID))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	exit, err := a.Exec(ctx, wire.ExecParams{Cmd: "mkdir -m 700 /opt/private", User: wire.UserRoot}, func(api.Event) error { return nil })
	if err != nil || exit == nil || exit.Code != 0 {
		t.Fatalf("setup: %+v %v", exit, err)
	}
	code := map[string]string{"python": "print(1+1)", "javascript": "console.log(1+1)", "bash": "echo $((1+1))", "r": "cat(1+1, \"\\n\")"}
	for _, lang := range []string{"python", "javascript", "bash", "r"} {
		for _, cwd := range []string{"/root", "/var/cache/ldconfig", "/opt/private"} {
			status, _, b := h.call("POST", "/contexts", map[string]any{"language": lang, "cwd": cwd}, jupyter(sb, true)...)
			if status != http.StatusForbidden || !strings.Contains(string(b), "may not enter") {
				t.Errorf("%s context in %s: %d %q; want 403", lang, cwd, status, b)
			}
		}
		var c struct{ ID string }
		status, _, b := h.call("POST", "/contexts", map[string]any{"language": lang, "cwd": "/tmp"}, jupyter(sb, true)...)
		if status != http.StatusOK || json.Unmarshal(b, &c) != nil || c.ID == "" {
			t.Fatalf("%s context in /tmp: %d %s", lang, status, b)
		}
		lines, _ := execute(h, sb, map[string]any{"code": code[lang], "context_id": c.ID})
		if out := ofType(lines, "stdout"); len(out) == 0 || strings.TrimSpace(out[0]["text"].(string)) != "2" {
			t.Errorf("%s context: %v", lang, lines)
		}
	}
	if got, err := h.m.Get(context.Background(), sandbox.ID(sb.SandboxID)); err != nil || got.State != sandbox.StateRunning {
		t.Fatalf("sandbox after the refused contexts: %+v %v", got, err)
	}
}
