package config

import (
	"testing"
	"time"
)

func TestBuildsFromEnv(t *testing.T) {
	def := Builds{Timeout: 30 * time.Minute, MaxContextBytes: GiB, MaxLayerBytes: 10 * GiB, MaxPerKey: 2, MaxConcurrent: 4}
	with := func(f func(*Builds)) Builds { b := def; f(&b); return b }
	keys := []string{"KILN_BUILD_TIMEOUT", "KILN_BUILD_MAX_CONTEXT", "KILN_BUILD_MAX_LAYER", "KILN_MAX_BUILDS_PER_KEY", "KILN_MAX_BUILDS"}
	for _, tc := range []struct {
		env   map[string]string
		want  Builds
		valid bool
	}{
		{nil, def, true},
		{map[string]string{"KILN_BUILD_TIMEOUT": "5m", "KILN_BUILD_MAX_CONTEXT": "64M", "KILN_BUILD_MAX_LAYER": "2G", "KILN_MAX_BUILDS_PER_KEY": "1", "KILN_MAX_BUILDS": "8"},
			Builds{Timeout: 5 * time.Minute, MaxContextBytes: 64 * MiB, MaxLayerBytes: 2 * GiB, MaxPerKey: 1, MaxConcurrent: 8}, true},
		{map[string]string{"KILN_BUILD_TIMEOUT": "later"}, with(func(b *Builds) { b.Timeout = -1 }), false},
		{map[string]string{"KILN_BUILD_MAX_CONTEXT": "huge"}, with(func(b *Builds) { b.MaxContextBytes = -1 }), false},
		{map[string]string{"KILN_BUILD_MAX_LAYER": "0"}, with(func(b *Builds) { b.MaxLayerBytes = -1 }), false},
		{map[string]string{"KILN_MAX_BUILDS_PER_KEY": "0"}, with(func(b *Builds) { b.MaxPerKey = -1 }), false},
		{map[string]string{"KILN_MAX_BUILDS": "x"}, with(func(b *Builds) { b.MaxConcurrent = -1 }), false},
	} {
		for _, k := range keys {
			t.Setenv(k, tc.env[k])
		}
		c := FromEnv()
		if got := c.Server.Builds.WithDefaults(); got != tc.want {
			t.Errorf("%v: %+v, want %+v", tc.env, got, tc.want)
		}
		if err := c.Server.Builds.validate(); (err == nil) != tc.valid {
			t.Errorf("%v: validate = %v, want valid %v", tc.env, err, tc.valid)
		}
	}
}
