package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
)

// TestVolumeCommands drives kiln volume create|ls|rm and kiln sandbox
// create --volume against a fake server, checking what they send.
func TestVolumeCommands(t *testing.T) {
	vol := api.Volume{ID: "vol-1", Name: "data", SizeBytes: 2 << 30, CreatedAt: time.Now().Add(-3 * time.Hour)}
	var reqs []string
	r, stdout, stderr := remoteFake(t, func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		reqs = append(reqs, req.Method+" "+req.URL.Path+" "+strings.TrimSpace(string(b)))
		switch {
		case req.Method == "POST" && req.URL.Path == "/v1/volumes":
			w.WriteHeader(201)
			json.NewEncoder(w).Encode(vol)
		case req.Method == "GET" && req.URL.Path == "/v1/volumes":
			json.NewEncoder(w).Encode(api.VolumeList{Volumes: []api.Volume{vol}, TotalBytes: vol.SizeBytes})
		case req.Method == "DELETE" && req.URL.Path == "/v1/volumes/data":
			w.WriteHeader(204)
		case req.Method == "POST" && req.URL.Path == "/v1/sandboxes":
			w.WriteHeader(201)
			json.NewEncoder(w).Encode(api.Sandbox{ID: "sbx_b"})
		default:
			w.WriteHeader(409)
			json.NewEncoder(w).Encode(api.Error{Code: api.CodeFailedPrecondition, Message: "volume in use"})
		}
	})
	ctx := context.Background()
	steps := []struct {
		run  func() error
		out  string
		code int
	}{
		{func() error { return r.volume(ctx, []string{"create", "--size", "2G", "data"}) }, "data vol-1 (2G)\n", 0},
		{func() error { return r.volume(ctx, []string{"ls"}) }, "NAME  ID     SIZE  AGE\ndata  vol-1  2G    3h\n1 volumes, 2G\n", 0},
		{func() error { return r.volume(ctx, []string{"rm", "data"}) }, "data\n", 0},
		{func() error { return r.volume(ctx, []string{"rm", "busy"}) }, "", 1},
		{func() error { return r.volume(ctx, []string{"create"}) }, "", 2},
		{func() error {
			return r.sandbox(ctx, []string{"create", "--volume", "data:/data", "--volume", "ref:/mnt/ref:ro"})
		}, "sbx_b\n", 0},
		{func() error { return r.sandbox(ctx, []string{"create", "--volume", "data"}) }, "", 2},
	}
	for i, s := range steps {
		stdout.Reset()
		if got := code(s.run()); got != s.code || stdout.String() != s.out {
			t.Errorf("step %d: exit %d, output %q (stderr %q); want %d, %q", i, got, stdout, stderr, s.code, s.out)
		}
	}
	for _, want := range []string{
		`POST /v1/volumes {"name":"data","size_bytes":2147483648}`,
		`POST /v1/sandboxes {"volumes":[{"volume":"data","path":"/data"},{"volume":"ref","path":"/mnt/ref","read_only":true}]}`,
	} {
		if !slices.Contains(reqs, want) {
			t.Errorf("no request %s in %q", want, reqs)
		}
	}
}
