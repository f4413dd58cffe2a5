package main

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-sh/kiln/api"
)

func TestSandboxCreateNetworkFlags(t *testing.T) {
	var got api.CreateSandboxRequest
	r, _, _ := remoteFake(t, func(w http.ResponseWriter, req *http.Request) {
		json.NewDecoder(req.Body).Decode(&got)
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(api.Sandbox{ID: "sbxnet01"})
	})
	err := r.sandbox(context.Background(), []string{"create", "--egress", "deny", "--allow", "pypi.org,10.1.0.0/16",
		"--allow", "files.pythonhosted.org", "--max-connections", "50", "--bandwidth", "1M"})
	if err != nil {
		t.Fatal(err)
	}
	n := got.Network
	if n == nil || n.Mode != "nat" || n.Egress != "deny" || n.MaxConnections != 50 || n.BandwidthBytes != 1<<20 ||
		!slices.Equal(n.Allow, []string{"pypi.org", "10.1.0.0/16", "files.pythonhosted.org"}) {
		t.Errorf("create request network = %+v", n)
	}
	got = api.CreateSandboxRequest{}
	if err := r.sandbox(context.Background(), []string{"create"}); err != nil || got.Network != nil {
		t.Errorf("create without network flags sent %+v (%v)", got.Network, err)
	}
}

// TestSandboxNetworkChange: the flags given replace those settings, the
// others keep their current values.
func TestSandboxNetworkChange(t *testing.T) {
	current := api.Network{Mode: "nat", Egress: "allow", Deny: []string{"evil.test"}, MaxConnections: 10, TrafficToken: "tok"}
	var put *api.Network
	r, stdout, _ := remoteFake(t, func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path != "/v1/sandboxes/sbxnet01/network" {
			t.Errorf("path %s", req.URL.Path)
		}
		if req.Method == http.MethodPut {
			put = new(api.Network)
			json.NewDecoder(req.Body).Decode(put)
			json.NewEncoder(w).Encode(put)
			return
		}
		json.NewEncoder(w).Encode(current)
	})
	if err := r.sandbox(context.Background(), []string{"network", "sbxnet01"}); err != nil || put != nil {
		t.Fatalf("show: %v, put %+v", err, put)
	}
	if !strings.Contains(stdout.String(), "evil.test") || !strings.Contains(stdout.String(), "tok") {
		t.Errorf("show printed %q", stdout)
	}
	if err := r.sandbox(context.Background(), []string{"network", "sbxnet01", "--egress", "deny", "--allow", "a.test"}); err != nil {
		t.Fatal(err)
	}
	if put == nil || put.Egress != "deny" || !slices.Equal(put.Allow, []string{"a.test"}) ||
		!slices.Equal(put.Deny, []string{"evil.test"}) || put.MaxConnections != 10 {
		t.Errorf("PUT %+v", put)
	}
}
