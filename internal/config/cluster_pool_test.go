package config

import (
	"strings"
	"testing"
)

// TestClusterPools: KILN_CLUSTER_POOL parses as KILN_POOL with a larger
// bound, and only a node takes it.
func TestClusterPools(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"code-interpreter=200,base=3", "base=3,code-interpreter=200"},
		{"site:v2=65", "site:v2=65"},
		{"base=100001", "error"},
		{"base=-1", "error"},
		{"base", "error"},
	} {
		p, got := ClusterPools{}, "error"
		if err := p.Set(tc.in); err == nil {
			got = p.String()
		}
		if got != tc.want {
			t.Errorf("ClusterPools.Set(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}

	const pg = "postgres://db/kiln"
	token := strings.Repeat("t", TokenMinLength)
	for _, role := range []string{RoleNode, RoleFront, RoleAll} {
		t.Setenv("KILN_ROLE", role)
		t.Setenv("KILN_CLUSTER_TOKEN", token)
		t.Setenv("KILN_CLUSTER_POOL", "base=4")
		err := clusterFromEnv(defaultCluster()).validate(pg)
		if (role == RoleNode) != (err == nil) {
			t.Errorf("role %s with KILN_CLUSTER_POOL: %v", role, err)
		}
	}
	t.Setenv("KILN_ROLE", RoleNode)
	t.Setenv("KILN_CLUSTER_POOL", "base=x")
	if err := clusterFromEnv(defaultCluster()).validate(pg); err == nil || !strings.Contains(err.Error(), "KILN_CLUSTER_POOL") {
		t.Errorf("a malformed KILN_CLUSTER_POOL: %v", err)
	}
}
