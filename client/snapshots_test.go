package client_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/client"
)

// TestSnapshotRoutes checks the snapshot methods' requests and answers.
func TestSnapshotRoutes(t *testing.T) {
	ctx := context.Background()
	snap := api.Snapshot{ID: "snp1", Name: "before.v2", Source: "sbx_1", SizeBytes: 42}
	tests := []struct {
		name         string
		status       int
		answer       any
		call         func(c *client.Client) (any, error)
		method, path string
		body         string
		result       any
	}{
		{"create", 201, snap, func(c *client.Client) (any, error) { return c.CreateSnapshot(ctx, "sbx_1", "before.v2") },
			"POST", "/v1/sandboxes/sbx_1/snapshots", `{"name":"before.v2"}`, &snap},
		{"list", 200, api.SnapshotList{Snapshots: []api.Snapshot{snap}, TotalBytes: 42}, func(c *client.Client) (any, error) { return c.ListSnapshots(ctx) },
			"GET", "/v1/snapshots", "", &api.SnapshotList{Snapshots: []api.Snapshot{snap}, TotalBytes: 42}},
		{"get", 200, snap, func(c *client.Client) (any, error) { return c.GetSnapshot(ctx, "before.v2") },
			"GET", "/v1/snapshots/before.v2", "", &snap},
		{"delete", 204, nil, func(c *client.Client) (any, error) { return nil, c.DeleteSnapshot(ctx, "before.v2") },
			"DELETE", "/v1/snapshots/before.v2", "", nil},
		{"create from", 201, api.Sandbox{ID: "sbx_2"}, func(c *client.Client) (any, error) {
			return c.CreateSandbox(ctx, api.CreateSandboxRequest{Snapshot: "before.v2", AutoPause: true})
		}, "POST", "/v1/sandboxes", `{"auto_pause":true,"snapshot":"before.v2"}`, &api.Sandbox{ID: "sbx_2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var method, path, body string
			c := fake(t, func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				method, path, body = r.Method, r.URL.Path, strings.TrimSpace(string(b))
				w.WriteHeader(tt.status)
				if tt.answer != nil {
					json.NewEncoder(w).Encode(tt.answer)
				}
			})
			res, err := tt.call(c)
			if err != nil {
				t.Fatal(err)
			}
			if method != tt.method || path != tt.path || body != tt.body {
				t.Errorf("request %s %s %s, want %s %s %s", method, path, body, tt.method, tt.path, tt.body)
			}
			if tt.result != nil {
				if diff := cmp.Diff(tt.result, res); diff != "" {
					t.Errorf("result (-want +got):\n%s", diff)
				}
			}
		})
	}
}
