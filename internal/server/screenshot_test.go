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
