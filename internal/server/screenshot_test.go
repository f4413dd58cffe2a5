package server_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/kiln-sh/kiln/api"
)

// TestScreenshotErrors checks GET /v1/sandboxes/{id}/screenshot and the
// computer tool on a sandbox without a desktop (base: no X server, no
// scrot, no xdotool): clear failed_precondition and tool errors, not 500;
// another key's sandbox 404 as on every route; a paused one 409; bad
// displays 400. The desktop itself is tested in cmd/kiln
// (TestDesktopNative).
func TestScreenshotErrors(t *testing.T) {
	h := newHarness(t, true, harnessOpts{})
	sb := h.create(h.a, api.CreateSandboxRequest{})
	path := "/v1/sandboxes/" + sb.ID + "/screenshot"

	var e api.Error
	h.do("GET", path, h.a, nil, http.StatusConflict, &e)
	if e.Code != api.CodeFailedPrecondition || !strings.Contains(e.Message, "no scrot") {
		t.Errorf("base sandbox: %+v", e)
	}
	h.do("GET", path, h.b, nil, http.StatusNotFound, nil)
	h.do("GET", path, "", nil, http.StatusUnauthorized, nil)
	for _, q := range []string{"?display=%3A0%3Bid", "?display=localhost:0", "?display=:0&display=:1", "?displays=:0", "?display=" + strings.Repeat("9", 30)} {
		h.do("GET", path+q, h.a, nil, http.StatusBadRequest, nil)
	}
	h.do("GET", "/v1/sandboxes/nosuchsandbox0000000/screenshot", h.a, nil, http.StatusNotFound, nil)

	for _, tc := range []struct{ args, want string }{
		{`{"action":"screenshot"}`, "no scrot"},
		{`{"action":"left_click","coordinate":[10,10]}`, "no xdotool"},
		{`{"action":"key","text":"Return"}`, "no xdotool"},
		{`{"action":"open","text":"https://example.com"}`, "no xdg-open"},
		{`{"action":"left_click","coordinate":[10]}`, "coordinate"},
		{`{"action":"key","text":"Return; rm -rf /"}`, "key"},
		{`{"action":"fly"}`, "want one of"},
	} {
		var res api.ToolResult
		h.do("POST", "/v1/sandboxes/"+sb.ID+"/tools/computer", h.a, json.RawMessage(tc.args), http.StatusOK, &res)
		if !res.IsError || len(res.Content) == 0 || !strings.Contains(res.Content[0].Text, tc.want) {
			t.Errorf("computer %s: %+v, want an error with %q", tc.args, res, tc.want)
		}
	}
	h.do("POST", "/v1/sandboxes/"+sb.ID+"/tools/computer", h.b, json.RawMessage(`{"action":"screenshot"}`), http.StatusNotFound, nil)

	h.do("POST", "/v1/sandboxes/"+sb.ID+"/pause", h.a, nil, http.StatusOK, nil)
	h.do("GET", path, h.a, nil, http.StatusConflict, &e)
	if !strings.Contains(e.Message, "paused") {
		t.Errorf("paused sandbox: %+v", e)
	}
	h.do("DELETE", "/v1/sandboxes/"+sb.ID, h.a, nil, http.StatusNoContent, nil)
	h.do("GET", path, h.a, nil, http.StatusConflict, nil) // stopped (killed), as the other agent routes
}

// TestScreenshotHostile replaces scrot in a sandbox with programs that
// answer what a hostile sandbox could: too much, no PNG, a PNG of an
// absurd size, binary noise on stderr, the X server's refusal. Each is a
// classed error with a bounded message; a scrot that never ends is cut
// at 20 s (504) and killed; the sandbox and server go on.
func TestScreenshotHostile(t *testing.T) {
	h := newHarness(t, true, harnessOpts{})
	sb := h.create(h.a, api.CreateSandboxRequest{})
	defer h.do("DELETE", "/v1/sandboxes/"+sb.ID, h.a, nil, http.StatusNoContent, nil)
	path := "/v1/sandboxes/" + sb.ID + "/screenshot"
	// An IHDR of 100000x1: a valid PNG header of no screen.
	const wide = `import struct, sys, zlib
ihdr = struct.pack(">IIBBBBB", 100000, 1, 8, 2, 0, 0, 0)
sys.stdout.buffer.write(b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr)))`
	for _, tc := range []struct {
		name, script string
		status       int
		want         string
	}{
		{"too much", "head -c 41943040 /dev/zero", http.StatusTooManyRequests, "larger than 32 MiB"},
		{"no png", "echo hello", http.StatusConflict, "scrot wrote no PNG of a screen (6 bytes)"},
		{"absurd size", "python3 -c '" + wide + "'", http.StatusConflict, "scrot wrote no PNG"},
		{"noise", "head -c 100000 /dev/urandom >&2; exit 3", http.StatusConflict, "scrot exited with code 3"},
		{"no display", `echo "scrot: Can't open X display. It *is* running, yeah?" >&2; exit 1`, http.StatusConflict, "no X server on display :0"},
		{"never ends", "exec sleep 1234", http.StatusGatewayTimeout, "scrot did not finish in 20s"},
	} {
		h.run(h.a, sb.ID, "cat > /usr/local/bin/scrot <<'EOF'\n#!/bin/sh\n"+tc.script+"\nEOF\nchmod 755 /usr/local/bin/scrot", "root")
		var e api.Error
		h.do("GET", path, h.a, nil, tc.status, &e)
		if !strings.Contains(e.Message, tc.want) || len(e.Message) > 600 {
			t.Errorf("%s: %d bytes: %.200q, want %q", tc.name, len(e.Message), e.Message, tc.want)
		}
	}
	if out := h.mustRun(h.a, sb.ID, "pgrep -x sleep || echo none"); out != "none\n" {
		t.Errorf("the scrot that never ended still runs: %q", out)
	}
	if out := h.mustRun(h.a, sb.ID, "echo alive"); out != "alive\n" {
		t.Errorf("the sandbox after: %q", out)
	}
}
