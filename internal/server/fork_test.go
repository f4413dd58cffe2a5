package server_test

import (
	"net/http"
	"os/exec"
	"strings"
	"testing"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/oci/ocitest"
)

// TestFork drives fork through the API, with the failure statuses.
func TestFork(t *testing.T) {
	_, err := exec.LookPath("runsc")
	ocitest.Require(t, err == nil, "runsc not installed")
	h := newHarness(t, true, harnessOpts{})
	sb := h.create(h.a, api.CreateSandboxRequest{Runtime: "runsc", Metadata: map[string]string{"k": "v"}})
	base := "/v1/sandboxes/" + sb.ID
	h.do("PUT", base+"/files?path=/home/user/kept.txt", h.a, nil, http.StatusOK, nil)

	h.do("POST", base+"/fork", h.a, api.ForkRequest{Count: 0}, http.StatusBadRequest, nil)
	h.do("POST", base+"/fork", h.a, api.ForkRequest{Count: 17}, http.StatusBadRequest, nil)
	h.do("POST", base+"/fork", h.b, api.ForkRequest{Count: 1}, http.StatusNotFound, nil)
	var got api.ForkResponse
	h.do("POST", base+"/fork", h.a, api.ForkRequest{Count: 2}, http.StatusCreated, &got)
	if len(got.Sandboxes) != 2 {
		t.Fatalf("fork: %+v", got)
	}
	for _, f := range got.Sandboxes {
		if f.ID == sb.ID || f.State != "running" || f.Metadata["k"] != "v" || f.Runtime != "runsc" {
			t.Errorf("fork: %+v", f)
		}
		fb := "/v1/sandboxes/" + f.ID
		h.do("GET", fb+"/files/stat?path=/home/user/kept.txt", h.a, nil, http.StatusOK, nil)
		h.do("GET", fb, h.b, nil, http.StatusNotFound, nil)
		resp := h.request("POST", fb+"/commands", h.a, strings.NewReader(`{"cmd":"echo ok"}`))
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("command in fork: %d", resp.StatusCode)
		}
		h.do("DELETE", fb, h.a, nil, http.StatusNoContent, nil)
	}
	h.do("POST", base+"/pause", h.a, nil, http.StatusOK, nil)
	h.do("POST", base+"/fork", h.a, api.ForkRequest{Count: 1}, http.StatusConflict, nil)
	h.do("DELETE", base, h.a, nil, http.StatusNoContent, nil)

	if _, err := exec.LookPath("runc"); err == nil {
		rc := h.create(h.a, api.CreateSandboxRequest{Runtime: "runc"})
		h.do("POST", "/v1/sandboxes/"+rc.ID+"/fork", h.a, api.ForkRequest{Count: 1}, http.StatusConflict, nil)
		h.do("DELETE", "/v1/sandboxes/"+rc.ID, h.a, nil, http.StatusNoContent, nil)
	}
}
