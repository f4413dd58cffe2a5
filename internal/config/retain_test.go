package config

import (
	"strings"
	"testing"
	"time"
)

func TestRetainEnded(t *testing.T) {
	if d := Default().Limits.RetainEnded; d != 7*24*time.Hour {
		t.Errorf("default RetainEnded = %v, want 168h", d)
	}
	for _, tc := range []struct {
		env  string
		want time.Duration
		bad  bool
	}{{"36h", 36 * time.Hour, false}, {"0", 0, true}, {"-1h", -time.Hour, true}, {"a week", -1, true}} {
		t.Setenv("KILN_RETAIN_ENDED", tc.env)
		c := FromEnv()
		if c.Limits.RetainEnded != tc.want {
			t.Errorf("KILN_RETAIN_ENDED=%s: %v, want %v", tc.env, c.Limits.RetainEnded, tc.want)
		}
		err := c.Validate()
		if bad := err != nil && strings.Contains(err.Error(), "KILN_RETAIN_ENDED"); bad != tc.bad {
			t.Errorf("KILN_RETAIN_ENDED=%s: Validate = %v, want an error about it: %v", tc.env, err, tc.bad)
		}
	}
}
