package config

import (
	"strings"
	"testing"
)

func TestNetworkSetup(t *testing.T) {
	for _, c := range []struct {
		env, def string
		want     string // Setup after FromEnv
		err      string // in Validate's error, "" for none
	}{
		{"", "", NetworkAuto, ""},
		{"auto", "", NetworkAuto, ""},
		{"on", "", NetworkOn, ""},
		{"1", "", NetworkOn, ""},
		{"true", "nat", NetworkOn, ""},
		{"off", "", NetworkOff, ""},
		{"0", "none", NetworkOff, ""},
		{"auto", "nat", NetworkAuto, ""},
		{"off", "nat", NetworkOff, "needs sandbox networking"},
		{"sometimes", "", "sometimes", "want auto, on or off"},
		{"", "bridge", NetworkAuto, "want none or nat"},
	} {
		t.Setenv("KILN_NETWORK", c.env)
		t.Setenv("KILN_NETWORK_DEFAULT", c.def)
		cfg := FromEnv()
		if cfg.Network.Setup != c.want {
			t.Errorf("KILN_NETWORK=%q: setup %q, want %q", c.env, cfg.Network.Setup, c.want)
		}
		err := cfg.Network.validate()
		switch {
		case c.err == "" && err != nil:
			t.Errorf("KILN_NETWORK=%q KILN_NETWORK_DEFAULT=%q: %v", c.env, c.def, err)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("KILN_NETWORK=%q KILN_NETWORK_DEFAULT=%q: %v, want %q", c.env, c.def, err, c.err)
		}
	}
}
