package e2b

import (
	"encoding/json"
	"testing"

	"github.com/kiln-sh/kiln/internal/sandbox"
)

func TestNetworkOptions(t *testing.T) {
	no := false
	for _, tc := range []struct {
		name          string
		allowInternet *bool
		network       string // E2B's JSON
		want          string // sandbox.NetworkOptions as JSON
	}{
		{"defaults", nil, ``, `{"Mode":"","Policy":{"egress":"allow"},"Public":true}`},
		{"no internet", &no, ``, `{"Mode":"","Policy":{"egress":"deny"},"Public":true}`},
		{"deny all but some", nil, `{"denyOut":["0.0.0.0/0"],"allowOut":["1.1.1.1","example.com"]}`,
			`{"Mode":"","Policy":{"egress":"deny","allow":["1.1.1.1","example.com"]},"Public":true}`},
		{"deny some", nil, `{"denyOut":["10.0.0.0/8"]}`, `{"Mode":"","Policy":{"egress":"allow","deny":["10.0.0.0/8"]},"Public":true}`},
		{"private ports", nil, `{"allowPublicTraffic":false}`, `{"Mode":"","Policy":{"egress":"allow"},"Public":false}`},
		{"mask host", nil, `{"maskRequestHost":"app.internal:${PORT}"}`,
			`{"Mode":"","Policy":{"egress":"allow"},"Public":true,"MaskHost":"app.internal:${PORT}"}`},
	} {
		var n *networkConfig
		if tc.network != "" {
			n = new(networkConfig)
			if err := json.Unmarshal([]byte(tc.network), n); err != nil {
				t.Fatal(err)
			}
		}
		got, _ := json.Marshal(networkOptions(tc.allowInternet, n))
		var want sandbox.NetworkOptions
		if err := json.Unmarshal([]byte(tc.want), &want); err != nil {
			t.Fatal(err)
		}
		if w, _ := json.Marshal(want); string(got) != string(w) {
			t.Errorf("%s: %s, want %s", tc.name, got, w)
		}
	}
}
