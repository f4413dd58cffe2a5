package server_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
)

// A sandbox created with auto_pause is paused at its timeout, and the next
// data-plane calls (here several at once) resume it transparently.
func TestAutoPauseResumesOnUse(t *testing.T) {
	h := newHarness(t, true, harnessOpts{})
	sb := h.create(h.a, api.CreateSandboxRequest{AutoPause: true, Timeout: 1, Env: map[string]string{"X": "kept"}})
	if !sb.AutoPause {
		t.Errorf("created: %+v", sb)
	}
	base := "/v1/sandboxes/" + sb.ID
	h.do("PUT", base+"/files?path=/home/user/kept.txt", h.a, nil, http.StatusOK, nil)
	var got api.Sandbox
	for deadline := time.Now().Add(20 * time.Second); got.State != "paused"; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not auto-paused: %+v", got)
		}
		h.do("GET", base, h.a, nil, http.StatusOK, &got)
	}
	// Another key's calls neither see nor wake it.
	h.do("GET", base+"/files/stat?path=/home/user/kept.txt", h.b, nil, http.StatusNotFound, nil)

	var wg sync.WaitGroup
	outs := make([]string, 4)
	for i := range outs {
		wg.Go(func() {
			resp := h.request("POST", base+"/commands", h.a, strings.NewReader(`{"cmd":"echo $X $KILN_SANDBOX_ID"}`), "Accept", "application/json")
			defer resp.Body.Close()
			var res api.CommandResult
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &res) != nil {
				outs[i] = resp.Status + " " + string(b)
				return
			}
			outs[i] = res.Stdout
		})
	}
	wg.Wait()
	for i, out := range outs {
		if out != "kept "+sb.ID+"\n" {
			t.Errorf("command %d on the auto-paused sandbox: %q", i, out)
		}
	}
	h.do("GET", base+"/files/stat?path=/home/user/kept.txt", h.a, nil, http.StatusOK, nil)
	h.do("GET", base, h.a, nil, http.StatusOK, &got)
	if got.State != "running" || !got.AutoPause || time.Until(got.ExpiresAt) > 2*time.Second {
		t.Errorf("after use: %+v", got)
	}
	// A sandbox without auto_pause stays paused when used.
	plain := h.create(h.a, api.CreateSandboxRequest{})
	h.do("POST", "/v1/sandboxes/"+plain.ID+"/pause", h.a, nil, http.StatusOK, nil)
	h.do("GET", "/v1/sandboxes/"+plain.ID+"/files/stat?path=/", h.a, nil, http.StatusConflict, nil)
}
