package config

import "testing"

func TestPublicFromEnv(t *testing.T) {
	for _, tc := range []struct {
		env   map[string]string
		want  Public
		valid bool
	}{
		{nil, Public{}, true},
		{map[string]string{"KILN_DOMAIN": "sandboxes.example.com"}, Public{Domain: "sandboxes.example.com"}, true},
		{map[string]string{"KILN_DOMAIN": "kiln.localhost:8420"}, Public{Domain: "kiln.localhost:8420"}, true},
		{map[string]string{"KILN_DOMAIN": "https://example.com"}, Public{Domain: "https://example.com"}, false},
		{map[string]string{"KILN_DOMAIN": "example.com/x"}, Public{Domain: "example.com/x"}, false},
		{map[string]string{"KILN_DOMAIN": "example.com:0"}, Public{Domain: "example.com:0"}, false},
		{map[string]string{"KILN_DOMAIN": "-a.example.com"}, Public{Domain: "-a.example.com"}, false},
		{map[string]string{"KILN_DOMAIN": "a..b"}, Public{Domain: "a..b"}, false},
		{map[string]string{"KILN_TLS_CERT": "/c.pem", "KILN_TLS_KEY": "/k.pem"}, Public{TLSCert: "/c.pem", TLSKey: "/k.pem"}, true},
		{map[string]string{"KILN_TLS_CERT": "/c.pem"}, Public{TLSCert: "/c.pem"}, false},
		{map[string]string{"KILN_TLS_KEY": "/k.pem"}, Public{TLSKey: "/k.pem"}, false},
	} {
		for _, k := range []string{"KILN_DOMAIN", "KILN_TLS_CERT", "KILN_TLS_KEY"} {
			t.Setenv(k, tc.env[k])
		}
		c := FromEnv()
		if c.Server.Public != tc.want {
			t.Errorf("%v: %+v, want %+v", tc.env, c.Server.Public, tc.want)
		}
		if err := c.Server.Public.validate(); (err == nil) != tc.valid {
			t.Errorf("%v: validate = %v, want valid %v", tc.env, err, tc.valid)
		}
	}
}

func TestDefaultDomain(t *testing.T) {
	for _, tc := range []struct {
		port int
		tls  bool
		want string
	}{
		{8420, false, "localhost:8420"},
		{8420, true, "localhost:8420"},
		{80, false, "localhost"},
		{443, true, "localhost"},
		{443, false, "localhost:443"},
	} {
		if got := DefaultDomain(tc.port, tc.tls); got != tc.want {
			t.Errorf("DefaultDomain(%d, %v) = %q, want %q", tc.port, tc.tls, got, tc.want)
		}
	}
}
