package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
)

// TestSnapshotCommands drives kiln sandbox snapshot, kiln snapshot
// ls|get|rm and kiln sandbox create --snapshot --auto-pause against a
// fake server.
func TestSnapshotCommands(t *testing.T) {
	now := time.Now()
	snap := api.Snapshot{ID: "snp1", Name: "base-ready", Source: "sbx_a", Template: "base", Runtime: "runsc",
		SizeBytes: 3 << 20, CreatedAt: now.Add(-2 * time.Hour)}
	var reqs []string
	r, stdout, stderr := remoteFake(t, func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		reqs = append(reqs, req.Method+" "+req.URL.Path+" "+strings.TrimSpace(string(b)))
		switch {
		case req.Method == "POST" && req.URL.Path == "/v1/sandboxes/sbx_a/snapshots":
			w.WriteHeader(201)
			json.NewEncoder(w).Encode(snap)
		case req.URL.Path == "/v1/snapshots":
			json.NewEncoder(w).Encode(api.SnapshotList{Snapshots: []api.Snapshot{snap}, TotalBytes: snap.SizeBytes})
		case req.Method == "GET" && req.URL.Path == "/v1/snapshots/base-ready":
			json.NewEncoder(w).Encode(snap)
		case req.Method == "DELETE" && req.URL.Path == "/v1/snapshots/base-ready":
			w.WriteHeader(204)
		case req.Method == "POST" && req.URL.Path == "/v1/sandboxes":
			w.WriteHeader(201)
			json.NewEncoder(w).Encode(api.Sandbox{ID: "sbx_b"})
		default:
			w.WriteHeader(404)
			json.NewEncoder(w).Encode(api.Error{Code: api.CodeNotFound, Message: "snapshot \"nope\": not found"})
		}
	})
	ctx := context.Background()
	steps := []struct {
		run  func() error
		out  string
		code int
	}{
		{func() error { return r.sandbox(ctx, []string{"snapshot", "sbx_a", "base-ready"}) }, "base-ready (3M)\n", 0},
		{func() error { return r.snapshot(ctx, []string{"ls"}) },
			"NAME        SOURCE  TEMPLATE  SIZE  AGE\nbase-ready  sbx_a   base      3M    2h\n1 snapshots, 3M\n", 0},
		{func() error { return r.snapshot(ctx, []string{"rm", "base-ready"}) }, "base-ready\n", 0},
		{func() error { return r.snapshot(ctx, []string{"get", "nope"}) }, "", 3},
		{func() error { return r.sandbox(ctx, []string{"create", "--snapshot", "base-ready", "--auto-pause"}) }, "sbx_b\n", 0},
		{func() error { return r.sandbox(ctx, []string{"snapshot", "sbx_a"}) }, "", 2},
	}
	for i, s := range steps {
		stdout.Reset()
		if got := code(s.run()); got != s.code || stdout.String() != s.out {
			t.Errorf("step %d: exit %d, output %q (stderr %q); want %d, %q", i, got, stdout, stderr, s.code, s.out)
		}
	}
	if last := reqs[len(reqs)-1]; last != `POST /v1/sandboxes {"auto_pause":true,"snapshot":"base-ready"}` {
		t.Errorf("create request: %s", last)
	}
}
