package server_test

import (
	"bytes"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/oci/ocitest"
)

// TestSnapshots drives snapshots through the API: take, list, get, create
// from, delete, with tenancy and the failure statuses.
func TestSnapshots(t *testing.T) {
	h := newHarness(t, true, harnessOpts{})
	_, err := exec.LookPath("runsc")
	ocitest.Require(t, err == nil, "runsc not installed")
	src := h.create(h.a, api.CreateSandboxRequest{Runtime: "runsc", Env: map[string]string{"X": "1"}})
	base := "/v1/sandboxes/" + src.ID
	h.do("PUT", base+"/files?path=/home/user/kept.txt", h.a, nil, http.StatusOK, nil)

	var snap api.Snapshot
	h.do("POST", base+"/snapshots", h.a, api.SnapshotRequest{Name: "s1"}, http.StatusCreated, &snap)
	if snap.Name != "s1" || snap.Source != src.ID || snap.Runtime != "runsc" || snap.SizeBytes <= 0 || snap.ID == "" {
		t.Errorf("snapshot: %+v", snap)
	}
	h.do("POST", base+"/snapshots", h.a, api.SnapshotRequest{Name: "s1"}, http.StatusConflict, nil)
	h.do("POST", base+"/snapshots", h.a, api.SnapshotRequest{Name: "../etc"}, http.StatusBadRequest, nil)
	h.do("POST", base+"/snapshots", h.b, api.SnapshotRequest{Name: "theirs"}, http.StatusNotFound, nil)

	var list api.SnapshotList
	h.do("GET", "/v1/snapshots", h.a, nil, http.StatusOK, &list)
	if len(list.Snapshots) != 1 || list.Snapshots[0].ID != snap.ID || list.TotalBytes != snap.SizeBytes {
		t.Errorf("list: %+v", list)
	}
	h.do("GET", "/v1/snapshots/s1", h.a, nil, http.StatusOK, nil)
	// Another key sees none of it.
	h.do("GET", "/v1/snapshots", h.b, nil, http.StatusOK, &list)
	if len(list.Snapshots) != 0 {
		t.Errorf("other key's list: %+v", list)
	}
	h.do("GET", "/v1/snapshots/s1", h.b, nil, http.StatusNotFound, nil)
	h.do("DELETE", "/v1/snapshots/s1", h.b, nil, http.StatusNotFound, nil)
	h.do("POST", "/v1/sandboxes", h.b, api.CreateSandboxRequest{Snapshot: "s1"}, http.StatusNotFound, nil)

	var sb api.Sandbox
	h.do("POST", "/v1/sandboxes", h.a, api.CreateSandboxRequest{Snapshot: "s1", Env: map[string]string{"Y": "2"}}, http.StatusCreated, &sb)
	if sb.ID == src.ID || sb.Runtime != "runsc" || sb.Env["X"] != "1" || sb.Env["Y"] != "2" || sb.State != "running" {
		t.Errorf("from snapshot: %+v", sb)
	}
	h.do("GET", "/v1/sandboxes/"+sb.ID+"/files/stat?path=/home/user/kept.txt", h.a, nil, http.StatusOK, nil)
	h.do("POST", "/v1/sandboxes", h.a, api.CreateSandboxRequest{Snapshot: "s1", Limits: api.Limits{MemoryBytes: 1 << 30}}, http.StatusBadRequest, nil)

	resp := h.request("GET", "/metrics", h.a, nil)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"kiln_snapshots 1", "kiln_snapshot_bytes ", `kiln_sandbox_operation_seconds_count{op="snapshot"} 1`} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("metrics lack %q", want)
		}
	}

	h.do("DELETE", "/v1/snapshots/s1", h.a, nil, http.StatusNoContent, nil)
	h.do("GET", "/v1/snapshots/s1", h.a, nil, http.StatusNotFound, nil)
	h.do("DELETE", "/v1/snapshots/s1", h.a, nil, http.StatusNotFound, nil)
	e := apiErr(t, h.request("POST", "/v1/sandboxes", h.a, strings.NewReader(`{"snapshot":"s1"}`)))
	if e.Code != api.CodeNotFound || !strings.Contains(e.Message, `snapshot "s1"`) {
		t.Errorf("create from deleted snapshot: %+v", e)
	}
	// A runc sandbox cannot be snapshotted.
	if _, err := exec.LookPath("runc"); err == nil {
		rc := h.create(h.a, api.CreateSandboxRequest{Runtime: "runc"})
		h.do("POST", "/v1/sandboxes/"+rc.ID+"/snapshots", h.a, api.SnapshotRequest{Name: "r"}, http.StatusConflict, nil)
	}
}
