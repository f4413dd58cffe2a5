package config

import (
	"testing"
	"time"
)

func TestEdgeFromEnv(t *testing.T) {
	for _, tc := range []struct {
		env   map[string]string
		want  Edge
		valid bool
	}{
		{nil, Edge{BodyTimeout: 30 * time.Second, MaxAnonymous: 256, MaxPendingConns: 1024}, true},
		{map[string]string{"KILN_BODY_TIMEOUT": "5s", "KILN_MAX_ANONYMOUS": "8", "KILN_MAX_PENDING_CONNS": "16"},
			Edge{BodyTimeout: 5 * time.Second, MaxAnonymous: 8, MaxPendingConns: 16}, true},
		{map[string]string{"KILN_BODY_TIMEOUT": "soon"}, Edge{BodyTimeout: -1, MaxAnonymous: 256, MaxPendingConns: 1024}, false},
		{map[string]string{"KILN_BODY_TIMEOUT": "0s"}, Edge{BodyTimeout: -1, MaxAnonymous: 256, MaxPendingConns: 1024}, false},
		{map[string]string{"KILN_MAX_ANONYMOUS": "0"}, Edge{BodyTimeout: 30 * time.Second, MaxAnonymous: -1, MaxPendingConns: 1024}, false},
		{map[string]string{"KILN_MAX_PENDING_CONNS": "many"}, Edge{BodyTimeout: 30 * time.Second, MaxAnonymous: 256, MaxPendingConns: -1}, false},
	} {
		for _, k := range []string{"KILN_BODY_TIMEOUT", "KILN_MAX_ANONYMOUS", "KILN_MAX_PENDING_CONNS"} {
			t.Setenv(k, tc.env[k])
		}
		c := FromEnv()
		got := c.Server.Edge.WithDefaults()
		if got != tc.want {
			t.Errorf("%v: %+v, want %+v", tc.env, got, tc.want)
		}
		if err := c.Server.Edge.validate(); (err == nil) != tc.valid {
			t.Errorf("%v: validate = %v, want valid %v", tc.env, err, tc.valid)
		}
	}
}
