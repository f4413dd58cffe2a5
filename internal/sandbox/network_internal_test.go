package sandbox

import (
	"errors"
	"testing"

	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/network"
)

// TestResolveNetwork: the request's mode wins, then the template's, then
// the server's, then nat if the server has networking (none without); nat
// needs networking on the server.
func TestResolveNetwork(t *testing.T) {
	withNet := &network.Network{}
	for _, c := range []struct {
		name         string
		req          *NetworkOptions
		tmpl, server string
		net          *network.Network
		want         string // "" for none
		err          error
	}{
		{"all defaults with networking", nil, "", "", withNet, "nat", nil},
		{"all defaults without networking", nil, "", "", nil, "", nil},
		{"policy without networking", &NetworkOptions{Policy: network.Policy{Deny: []string{"x.test"}}}, "", "", nil, "", nil},
		{"server default none", nil, "", "none", withNet, "", nil},
		{"server default nat", nil, "", "nat", withNet, "nat", nil},
		{"template over server", nil, "none", "nat", withNet, "", nil},
		{"template nat", nil, "nat", "", withNet, "nat", nil},
		{"request over template", &NetworkOptions{Mode: "none"}, "nat", "nat", withNet, "", nil},
		{"request nat", &NetworkOptions{Mode: "nat"}, "", "", withNet, "nat", nil},
		{"policy without mode takes default", &NetworkOptions{Policy: network.Policy{Deny: []string{"x.test"}}}, "nat", "", withNet, "nat", nil},
		{"nat without networking", &NetworkOptions{Mode: "nat"}, "", "", nil, "", errdefs.ErrFailedPrecondition},
		{"bad mode", &NetworkOptions{Mode: "bridge"}, "", "", withNet, "", errdefs.ErrInvalidArgument},
		{"mask host", &NetworkOptions{MaskHost: "app.test:${PORT}"}, "", "", withNet, "nat", nil},
		{"bad mask host", &NetworkOptions{MaskHost: "http://app.test/"}, "", "", withNet, "", errdefs.ErrInvalidArgument},
		{"bad mask host without networking", &NetworkOptions{MaskHost: "a b"}, "", "", nil, "", errdefs.ErrInvalidArgument},
		{"mask host without networking", &NetworkOptions{MaskHost: "app.test"}, "", "", nil, "", errdefs.ErrFailedPrecondition},
		{"mask host of mode none", &NetworkOptions{Mode: "none", MaskHost: "app.test"}, "", "", withNet, "", errdefs.ErrFailedPrecondition},
		{"bad policy", &NetworkOptions{Mode: "nat", Policy: network.Policy{Egress: "maybe"}}, "", "", withNet, "", errdefs.ErrInvalidArgument},
	} {
		m := &Manager{cfg: Config{Config: config.Config{Network: config.Network{DefaultMode: c.server}}, Net: c.net}}
		got, err := m.resolveNetwork(c.req, c.tmpl)
		switch {
		case c.err != nil:
			if !errors.Is(err, c.err) {
				t.Errorf("%s: err %v, want %v", c.name, err, c.err)
			}
		case err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.want == "" && got != nil, c.want != "" && (got == nil || got.Mode != c.want):
			t.Errorf("%s: got %+v, want mode %q", c.name, got, c.want)
		}
	}
}
