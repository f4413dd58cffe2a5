package e2b_test

import (
	"net/http"
	"testing"
	"time"
)

// TestBareCreateDefaults: e2b 2.51 sends only what its caller set, so a
// create body without timeout, secure or allow_internet_access must get
// what the SDKs used to send (timeout 300 s, secure) on both routes: the
// same sandbox as the old SDKs' explicit body.
func TestBareCreateDefaults(t *testing.T) {
	h := newHarness(t, "base")
	oldSDK := map[string]any{"templateID": "base", "timeout": 300, "secure": true,
		"allow_internet_access": true, "autoPause": false}
	var explicit listedJSON
	var sb sandboxJSON
	h.api("POST", "/sandboxes", h.a, oldSDK, http.StatusCreated, &sb)
	h.api("GET", "/sandboxes/"+sb.SandboxID, h.a, nil, http.StatusOK, &explicit)

	for _, path := range []string{"/v2/sandboxes", "/sandboxes"} {
		for _, body := range []map[string]any{{"templateID": "base"}, nil} {
			var sb sandboxJSON
			h.api("POST", path, h.a, body, http.StatusCreated, &sb)
			var d listedJSON
			h.api("GET", "/sandboxes/"+sb.SandboxID, h.a, nil, http.StatusOK, &d)
			life := d.EndAt.Sub(d.StartedAt)
			if life < 299*time.Second || life > 301*time.Second {
				t.Errorf("POST %s %v: lives %v, want E2B's default 300s", path, body, life)
			}
			if sb.EnvdAccessToken == "" || sb.TemplateID != "base" || d.Lifecycle == nil || d.Lifecycle.OnTimeout != "kill" {
				t.Errorf("POST %s %v: %+v, %+v: want a secured base sandbox killed on timeout", path, body, sb, d)
			}
			if d.CPUCount != explicit.CPUCount || d.MemoryMB != explicit.MemoryMB || d.DiskSizeMB != explicit.DiskSizeMB {
				t.Errorf("POST %s %v: %d CPUs, %d MB, disk %d MB; the old SDKs' body got %d, %d, %d", path, body,
					d.CPUCount, d.MemoryMB, d.DiskSizeMB, explicit.CPUCount, explicit.MemoryMB, explicit.DiskSizeMB)
			}
			h.api("DELETE", "/sandboxes/"+sb.SandboxID, h.a, nil, http.StatusNoContent, nil)
		}
	}
}
