package config

import (
	"strings"
	"testing"
)

func TestAgentPingMaxRate(t *testing.T) {
	if r := Default().Liveness.MaxRate; r != 100 {
		t.Errorf("default ping max rate = %v, want 100", r)
	}
	for _, tc := range []struct {
		env  string
		want float64
		bad  bool
	}{{"250", 250, false}, {"0.5", 0.5, false}, {"0", 0, false}, {"-3", 0, true}, {"NaN", 0, true}, {"+Inf", 0, true}, {"fast", 0, true}} {
		t.Setenv("KILN_AGENT_PING_MAX_RATE", tc.env)
		c := FromEnv()
		if got := c.Liveness.MaxRate; !tc.bad && got != tc.want {
			t.Errorf("KILN_AGENT_PING_MAX_RATE=%s: %v, want %v", tc.env, got, tc.want)
		}
		err := c.Validate()
		if bad := err != nil && strings.Contains(err.Error(), "KILN_AGENT_PING_MAX_RATE"); bad != tc.bad {
			t.Errorf("KILN_AGENT_PING_MAX_RATE=%s: Validate = %v, want an error about it: %v", tc.env, err, tc.bad)
		}
	}
}
