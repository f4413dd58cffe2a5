package e2b

import (
	"maps"
	"net/url"
	"testing"
)

func TestMetadataFilter(t *testing.T) {
	for _, tc := range []struct {
		rawQuery string // as the SDK sends it
		want     map[string]string
		bad      bool
	}{
		// e2b 2.51: encodeURIComponent on keys and values, URLSearchParams,
		// then openapi-fetch encodes the whole value once more.
		{"metadata=a%252520b%3Dc%252526d%25253De", map[string]string{"a b": "c&d=e"}, false},
		{"metadata=user%3Dalice%26n%3D1", map[string]string{"user": "alice", "n": "1"}, false},
		{"metadata=", nil, false},
		{"metadata=novalue", nil, true},
		{"metadata=%2525zz%3D1", nil, true},
	} {
		q, err := url.ParseQuery(tc.rawQuery)
		if err != nil {
			t.Fatal(err)
		}
		got, err := metadataFilter(q.Get("metadata"))
		if (err != nil) != tc.bad || !maps.Equal(got, tc.want) {
			t.Errorf("%s: %v, %v; want %v (error: %v)", tc.rawQuery, got, err, tc.want, tc.bad)
		}
	}
}
