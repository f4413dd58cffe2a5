package config

import (
	"strings"
	"testing"
	"time"
)

func TestClusterValidate(t *testing.T) {
	const pg = "postgres://db/kiln"
	token := strings.Repeat("t", TokenMinLength)
	node := func(f func(*Cluster)) Cluster {
		c := defaultCluster()
		c.Role, c.Token, c.NodeName = RoleNode, token, "node-1"
		if f != nil {
			f(&c)
		}
		return c
	}
	for _, tc := range []struct {
		name  string
		c     Cluster
		store string
		want  string // "" for valid, else part of the error
	}{
		{"all needs nothing", defaultCluster(), "", ""},
		{"empty role is all", Cluster{}, "", ""},
		{"node", node(nil), pg, ""},
		{"front", node(func(c *Cluster) { c.Role = RoleFront }), "postgresql://db/kiln", ""},
		{"unknown role", Cluster{Role: "leader"}, pg, "want all, node or front"},
		{"node on sqlite", node(nil), "sqlite", "needs the shared catalog"},
		{"front on the default store", node(func(c *Cluster) { c.Role = RoleFront }), "", "needs the shared catalog"},
		{"short token", node(func(c *Cluster) { c.Token = "secret" }), pg, "cluster token of at least"},
		{"bad node name", node(func(c *Cluster) { c.NodeName = "../x" }), pg, "node name"},
		{"no slots", node(func(c *Cluster) { c.Slots = 0 }), pg, "node slots"},
		{"fast heartbeat", node(func(c *Cluster) { c.Heartbeat = time.Millisecond }), pg, "heartbeat interval"},
		{"one miss", node(func(c *Cluster) { c.LostAfter = 1 }), pg, "heartbeats missed"},
		{"advertise URL", node(func(c *Cluster) { c.AdvertiseURL = "http://10.0.0.5:8420" }), pg, ""},
		{"advertise URL with a path", node(func(c *Cluster) { c.AdvertiseURL = "http://10.0.0.5:8420/api" }), pg, "advertise URL"},
		{"advertise URL not http", node(func(c *Cluster) { c.AdvertiseURL = "unix:///x" }), pg, "advertise URL"},
		{"registry on loopback", node(func(c *Cluster) { c.Registry = "127.0.0.1:5000/kiln" }), pg, ""},
		{"registry with a name", node(func(c *Cluster) { c.Registry = "registry.internal/kiln/templates" }), pg, ""},
		{"registry bare host", node(func(c *Cluster) { c.Registry = "localhost:5000" }), pg, ""},
		{"registry IPv6", node(func(c *Cluster) { c.Registry = "[::1]:5000/k" }), pg, ""},
		{"registry without a host", node(func(c *Cluster) { c.Registry = "kiln/templates" }), pg, "cluster registry"},
		{"registry uppercase path", node(func(c *Cluster) { c.Registry = "reg.io/Kiln" }), pg, "cluster registry"},
		{"registry with a tag", node(func(c *Cluster) { c.Registry = "reg.io/kiln:v1" }), pg, "cluster registry"},
		{"registry URL", node(func(c *Cluster) { c.Registry = "https://reg.io/kiln" }), pg, "cluster registry"},
		{"registry too long", node(func(c *Cluster) { c.Registry = "reg.io/" + strings.Repeat("k", 200) }), pg, "cluster registry"},
		{"no drain", node(func(c *Cluster) { c.DrainTimeout = 0 }), pg, ""},
		{"negative drain", node(func(c *Cluster) { c.DrainTimeout = -1 }), pg, "drain timeout"},
		{"drain of days", node(func(c *Cluster) { c.DrainTimeout = 48 * time.Hour }), pg, "drain timeout"},
		{"front with K 0", node(func(c *Cluster) { c.Role, c.PlacementK = RoleFront, 0 }), pg, "placement sample size"},
		{"shared snapshot dir", node(func(c *Cluster) { c.SnapshotDir = "/srv/kiln-shared" }), pg, ""},
		{"relative snapshot dir", node(func(c *Cluster) { c.SnapshotDir = "shared" }), pg, "clean absolute path"},
		{"unclean snapshot dir", node(func(c *Cluster) { c.SnapshotDir = "/srv/../etc/" }), pg, "clean absolute path"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.c.validate(tc.store)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("validate = %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("validate = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestDrainTimeoutFromEnv: KILN_DRAIN_TIMEOUT is a duration (default
// 30s); a malformed one is kept invalid for validate.
func TestDrainTimeoutFromEnv(t *testing.T) {
	if got := defaultCluster().DrainTimeout; got != 30*time.Second {
		t.Errorf("default drain timeout %v, want 30s", got)
	}
	for in, want := range map[string]time.Duration{"0": 0, "2m": 2 * time.Minute, "soon": -1} {
		t.Setenv("KILN_DRAIN_TIMEOUT", in)
		if got := clusterFromEnv(defaultCluster()).DrainTimeout; got != want {
			t.Errorf("KILN_DRAIN_TIMEOUT=%s: %v, want %v", in, got, want)
		}
	}
}
