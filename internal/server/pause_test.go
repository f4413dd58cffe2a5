package server_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/kiln-sh/kiln/api"
)

// TestPauseResume drives pause and resume through the API, with the
// failure statuses.
func TestPauseResume(t *testing.T) {
	h := newHarness(t, true, harnessOpts{})
	sb := h.create(h.a, api.CreateSandboxRequest{})
	base := "/v1/sandboxes/" + sb.ID
	h.do("PUT", base+"/files?path=/home/user/kept.txt", h.a, nil, http.StatusOK, nil)

	var got api.Sandbox
	h.do("POST", base+"/resume", h.a, nil, http.StatusConflict, nil)
	h.do("POST", base+"/pause", h.a, nil, http.StatusOK, &got)
	if got.State != "paused" {
		t.Errorf("after pause: %+v", got)
	}
	h.do("POST", base+"/pause", h.a, nil, http.StatusConflict, nil)
	h.do("GET", base+"/files/stat?path=/home/user/kept.txt", h.a, nil, http.StatusConflict, nil)
	h.do("POST", base+"/resume", h.a, nil, http.StatusOK, &got)
	if got.State != "running" {
		t.Errorf("after resume: %+v", got)
	}
	h.do("GET", base+"/files/stat?path=/home/user/kept.txt", h.a, nil, http.StatusOK, nil)
	resp := h.request("POST", base+"/commands", h.a, strings.NewReader(`{"cmd":"echo ok"}`))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("command after resume: %d", resp.StatusCode)
	}

	h.do("DELETE", base, h.a, nil, http.StatusNoContent, nil)
	h.do("POST", base+"/resume", h.a, nil, http.StatusNotFound, nil)
	h.do("POST", "/v1/sandboxes/nosuchsandbox0000000/pause", h.a, nil, http.StatusNotFound, nil)
}
