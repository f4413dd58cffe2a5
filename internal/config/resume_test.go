package config

import (
	"strings"
	"testing"
)

func TestResumeReadyEnv(t *testing.T) {
	for _, tc := range []struct {
		env       string
		want, bad bool
	}{{"", false, false}, {"1", true, false}, {"true", true, false}, {"On", true, false}, {"yes", true, false},
		{"0", false, false}, {"off", false, false}, {"2", false, true}, {"enable", false, true}} {
		t.Setenv("KILN_RESUME_READY", tc.env)
		c := FromEnv()
		if c.ResumeReady != tc.want {
			t.Errorf("KILN_RESUME_READY=%q: ResumeReady = %v, want %v", tc.env, c.ResumeReady, tc.want)
		}
		err := c.Validate()
		if bad := err != nil && strings.Contains(err.Error(), "KILN_RESUME_READY"); bad != tc.bad {
			t.Errorf("KILN_RESUME_READY=%q: Validate = %v, want an error about it: %v", tc.env, err, tc.bad)
		}
	}
}
