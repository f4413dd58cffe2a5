package config

import "testing"

func TestParsePools(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string // String() of the result; "error" if invalid
	}{
		{"", ""},
		{"code-interpreter=2,base=4", "base=4,code-interpreter=2"},
		{" base = 1 , ", "base=1"},
		{"base=0", "base=0"},
		{"base", "error"},
		{"base=x", "error"},
		{"base=-1", "error"},
		{"base=65", "error"},
		{"../x=1", "error"},
	} {
		p, err := ParsePools(tc.in)
		got := p.String()
		if err != nil {
			got = "error"
		}
		if got != tc.want {
			t.Errorf("ParsePools(%q) = %q (%v), want %q", tc.in, got, err, tc.want)
		}
	}
}
