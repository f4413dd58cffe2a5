package network_test

import (
	"errors"
	"testing"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/network"
)

func TestValidateMaskHost(t *testing.T) {
	for _, c := range []struct {
		mask string
		ok   bool
	}{
		{"", true},
		{"app.example.com", true},
		{"app.example.com:8080", true},
		{"localhost:${PORT}", true},
		{"${PORT}-app.example.com", true},
		{"10.0.0.5", true},
		{"10.0.0.5:80", true},
		{"[::1]:80", true},
		{"app_1.internal.", true},
		{"http://app.example.com", false},
		{"app.example.com/path", false},
		{"user@app.example.com", false},
		{"app example.com", false},
		{"app.example.com:0", false},
		{"app.example.com:70000", false},
		{"app.example.com:port", false},
		{"-app.example.com", false},
		{"a..b", false},
		{"a:b:c", false},
		{"app.example.com\r\nX-Evil: 1", false},
		{string(make([]byte, 300)), false},
	} {
		err := network.ValidateMaskHost(c.mask)
		if c.ok && err != nil {
			t.Errorf("%q: %v", c.mask, err)
		}
		if !c.ok && !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%q: %v, want invalid argument", c.mask, err)
		}
	}
}

func TestMaskedHost(t *testing.T) {
	for _, c := range []struct {
		mask, host string
		port       int
		want       string
	}{
		{"", "8000-x.localhost:8420", 8000, "8000-x.localhost:8420"},
		{"app.example.com", "8000-x.localhost:8420", 8000, "app.example.com"},
		{"localhost:${PORT}", "h", 3000, "localhost:3000"},
		{"${PORT}-a.${PORT}.test", "h", 5, "5-a.5.test"},
	} {
		if got := network.MaskedHost(c.mask, c.host, c.port); got != c.want {
			t.Errorf("MaskedHost(%q, %q, %d) = %q, want %q", c.mask, c.host, c.port, got, c.want)
		}
	}
}
