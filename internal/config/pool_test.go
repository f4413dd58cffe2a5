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
		// Tags, as template.ParseRef reads them; the default tag is the
		// bare name, so it cannot make a second pool of one build.
		{"site:v2=1,site=2", "site=2,site:v2=1"},
		{"site:default=3", "site=3"},
		{"site:=1", "site=1"},
		{"site:V2=1", "error"},
		{"site:v2:x=1", "error"},
		{":v2=1", "error"},
		{"site:../x=1", "error"},
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
