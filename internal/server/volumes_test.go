package server_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/kiln-sh/kiln/api"
)

// run runs cmd in sandbox id as key, as the default user unless user is
// set, and returns its result.
func (h *harness) run(key, id, cmd, user string) api.CommandResult {
	h.t.Helper()
	b, _ := json.Marshal(api.CommandRequest{Cmd: cmd, User: user})
	resp := h.request("POST", "/v1/sandboxes/"+id+"/commands", key, strings.NewReader(string(b)), "Accept", "application/json")
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var res api.CommandResult
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &res) != nil {
		h.t.Fatalf("running %q: %s %s", cmd, resp.Status, body)
	}
	return res
}

// mustRun runs cmd and fails the test unless it exits 0.
func (h *harness) mustRun(key, id, cmd string) string {
	h.t.Helper()
	res := h.run(key, id, cmd, "")
	if res.Exit.Code != 0 {
		h.t.Fatalf("%q: exit %d, stdout %q stderr %q", cmd, res.Exit.Code, res.Stdout, res.Stderr)
	}
	return res.Stdout
}

// TestVolumes drives volumes through the native API on both runtimes:
// rw and ro mounts written by the default user, two sandboxes sharing a
// volume, data surviving its sandboxes, the size quota (ENOSPC, and the
// sandbox lives on), refusals (in use, pause, fork, bad mounts) and
// tenancy.
func TestVolumes(t *testing.T) {
	const quota = 200 << 20
	h := newHarness(t, true, harnessOpts{volumeQuota: quota})
	for _, rt := range []string{"runsc", "runc"} {
		t.Run(rt, func(t *testing.T) { testVolumes(t, h.with(t), rt) })
	}
	t.Run("quota per key", func(t *testing.T) {
		h := h.with(t)
		var list api.VolumeList
		h.do("GET", "/v1/volumes", h.b, nil, http.StatusOK, &list)
		h.do("POST", "/v1/volumes", h.b, api.CreateVolumeRequest{Name: "big", SizeBytes: quota - list.TotalBytes}, http.StatusCreated, nil)
		h.do("POST", "/v1/volumes", h.b, api.CreateVolumeRequest{Name: "more", SizeBytes: 16 << 20}, http.StatusTooManyRequests, nil)
		h.do("DELETE", "/v1/volumes/big", h.b, nil, http.StatusNoContent, nil)
		h.do("POST", "/v1/volumes", h.b, api.CreateVolumeRequest{Name: "more", SizeBytes: 16 << 20}, http.StatusCreated, nil)
		h.do("POST", "/v1/volumes", h.b, api.CreateVolumeRequest{Name: "more"}, http.StatusConflict, nil)
		h.do("DELETE", "/v1/volumes/more", h.b, nil, http.StatusNoContent, nil)
	})
	t.Run("bad volume requests", func(t *testing.T) {
		h := h.with(t)
		for _, req := range []api.CreateVolumeRequest{
			{Name: ""}, {Name: "../x"}, {Name: "a/b"}, {Name: strings.Repeat("a", 64)},
			{Name: "tiny", SizeBytes: 1 << 20}, {Name: "neg", SizeBytes: -1},
		} {
			h.do("POST", "/v1/volumes", h.a, req, http.StatusBadRequest, nil)
		}
	})
}

func testVolumes(t *testing.T, h *harness, rt string) {
	var data, shared api.Volume
	h.do("POST", "/v1/volumes", h.a, api.CreateVolumeRequest{Name: "data-" + rt, SizeBytes: 32 << 20}, http.StatusCreated, &data)
	h.do("POST", "/v1/volumes", h.a, api.CreateVolumeRequest{Name: "shared-" + rt, SizeBytes: 16 << 20}, http.StatusCreated, &shared)
	if data.ID == "" || data.Name != "data-"+rt || data.SizeBytes != 32<<20 {
		t.Fatalf("created %+v", data)
	}

	// Tenancy: another key sees none of them, by id or name, and cannot
	// mount or delete them.
	h.do("GET", "/v1/volumes/"+data.ID, h.b, nil, http.StatusNotFound, nil)
	h.do("GET", "/v1/volumes/"+data.Name, h.b, nil, http.StatusNotFound, nil)
	h.do("DELETE", "/v1/volumes/"+data.ID, h.b, nil, http.StatusNotFound, nil)
	var listB api.VolumeList
	h.do("GET", "/v1/volumes", h.b, nil, http.StatusOK, &listB)
	for _, v := range listB.Volumes {
		if v.ID == data.ID || v.ID == shared.ID {
			t.Errorf("key b lists key a's volume %+v", v)
		}
	}
	h.do("POST", "/v1/sandboxes", h.b, api.CreateSandboxRequest{Runtime: rt,
		Volumes: []api.VolumeMount{{Volume: data.ID, Path: "/data"}}}, http.StatusBadRequest, nil)

	// Bad mounts.
	for _, ms := range [][]api.VolumeMount{
		{{Volume: data.ID, Path: "data"}},
		{{Volume: data.ID, Path: "/"}},
		{{Volume: data.ID, Path: "/proc/x"}},
		{{Volume: data.ID, Path: "/.kiln"}},
		{{Volume: data.ID, Path: "/sys"}},
		{{Volume: data.ID, Path: "/a/../b"}},
		{{Volume: "no-such-volume", Path: "/data"}},
		{{Volume: "", Path: "/data"}},
		{{Volume: data.ID, Path: "/data"}, {Volume: shared.ID, Path: "/data"}},
	} {
		h.do("POST", "/v1/sandboxes", h.a, api.CreateSandboxRequest{Runtime: rt, Volumes: ms}, http.StatusBadRequest, nil)
	}
	h.do("POST", "/v1/sandboxes", h.a, api.CreateSandboxRequest{Runtime: rt, AutoPause: true,
		Volumes: []api.VolumeMount{{Volume: data.ID, Path: "/data"}}}, http.StatusBadRequest, nil)

	// A read-write and a read-only mount; the default user writes the
	// first (by name) and cannot write the second.
	one := h.create(h.a, api.CreateSandboxRequest{Runtime: rt, Volumes: []api.VolumeMount{
		{Volume: data.Name, Path: "/mnt/data"}, {Volume: shared.ID, Path: "/mnt/shared", ReadOnly: true},
	}})
	if len(one.Volumes) != 2 || one.Volumes[1].Path != "/mnt/shared" || !one.Volumes[1].ReadOnly {
		t.Errorf("create answered volumes %+v", one.Volumes)
	}
	if got := h.mustRun(h.a, one.ID, "id -u; echo hello > /mnt/data/f && cat /mnt/data/f"); got != "1000\nhello\n" {
		t.Errorf("rw volume: %q", got)
	}
	if res := h.run(h.a, one.ID, "echo x > /mnt/shared/f", ""); res.Exit.Code == 0 || !strings.Contains(res.Stderr, "Read-only") {
		t.Errorf("writing a read-only volume: exit %d, stderr %q", res.Exit.Code, res.Stderr)
	}
	if res := h.run(h.a, one.ID, "echo x > /mnt/shared/f", "root"); res.Exit.Code == 0 {
		t.Errorf("root wrote a read-only volume: %+v", res)
	}

	// A second sandbox shares the volume, both ways, while the first runs.
	two := h.create(h.a, api.CreateSandboxRequest{Runtime: rt, Volumes: []api.VolumeMount{{Volume: data.ID, Path: "/work"}}})
	if got := h.mustRun(h.a, two.ID, "cat /work/f; echo from-two > /work/g"); got != "hello\n" {
		t.Errorf("second sandbox reads %q", got)
	}
	if got := h.mustRun(h.a, one.ID, "cat /mnt/data/g"); got != "from-two\n" {
		t.Errorf("first sandbox reads the second's file: %q", got)
	}

	// What a sandbox with volumes cannot do, and a volume in use.
	h.do("POST", "/v1/sandboxes/"+one.ID+"/pause", h.a, nil, http.StatusConflict, nil)
	h.do("POST", "/v1/sandboxes/"+one.ID+"/fork", h.a, api.ForkRequest{Count: 1}, http.StatusConflict, nil)
	h.do("POST", "/v1/sandboxes/"+one.ID+"/snapshots", h.a, api.SnapshotRequest{Name: "s-" + rt}, http.StatusConflict, nil)
	h.do("DELETE", "/v1/volumes/"+data.ID, h.a, nil, http.StatusConflict, nil)

	// The size quota: a write past it fails with ENOSPC; the sandbox
	// lives on and its earlier data is intact.
	res := h.run(h.a, one.ID, "dd if=/dev/zero of=/mnt/data/big bs=1M count=64", "")
	if res.Exit.Code == 0 || !strings.Contains(res.Stderr, "No space left") {
		t.Errorf("writing past the quota: exit %d, stderr %q", res.Exit.Code, res.Stderr)
	}
	if got := h.mustRun(h.a, one.ID, "rm /mnt/data/big; cat /mnt/data/f"); got != "hello\n" {
		t.Errorf("after ENOSPC: %q", got)
	}

	// Data survives its sandboxes; once none mounts it, it can go.
	h.do("DELETE", "/v1/sandboxes/"+one.ID, h.a, nil, http.StatusNoContent, nil)
	h.do("DELETE", "/v1/volumes/"+data.ID, h.a, nil, http.StatusConflict, nil) // two still mounts it
	h.do("DELETE", "/v1/sandboxes/"+two.ID, h.a, nil, http.StatusNoContent, nil)
	three := h.create(h.a, api.CreateSandboxRequest{Runtime: rt, Volumes: []api.VolumeMount{{Volume: data.ID, Path: "/home/user/data"}}})
	if got := h.mustRun(h.a, three.ID, "cat ~/data/f ~/data/g"); got != "hello\nfrom-two\n" {
		t.Errorf("after its sandboxes ended the volume holds %q", got)
	}
	h.do("DELETE", "/v1/sandboxes/"+three.ID, h.a, nil, http.StatusNoContent, nil)
	for _, v := range []api.Volume{data, shared} {
		h.do("DELETE", "/v1/volumes/"+v.ID, h.a, nil, http.StatusNoContent, nil)
		h.do("GET", "/v1/volumes/"+v.ID, h.a, nil, http.StatusNotFound, nil)
	}
}
