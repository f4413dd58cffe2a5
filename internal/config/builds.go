package config

import (
	"errors"
	"os"
	"strconv"
	"time"
)

// Builds bounds template builds (internal/template/builder). Zero fields
// take the defaults.
type Builds struct {
	// Timeout bounds one build (KILN_BUILD_TIMEOUT, default 30m).
	Timeout time.Duration
	// MaxContextBytes bounds one uploaded file set: a COPY/ADD step's
	// sources or an image archive (KILN_BUILD_MAX_CONTEXT, default 1G).
	MaxContextBytes int64
	// MaxLayerBytes bounds what one step (or image layer) writes
	// (KILN_BUILD_MAX_LAYER, default 10G).
	MaxLayerBytes int64
	// MaxPerKey and MaxConcurrent bound the builds running at once, per
	// API key and in total (KILN_MAX_BUILDS_PER_KEY, default 2;
	// KILN_MAX_BUILDS, default 4); more are answered 429.
	MaxPerKey     int
	MaxConcurrent int
	// LoopbackRegistries lets builds pull images from registries on this
	// host's loopback (KILN_BUILD_LOOPBACK_REGISTRIES=1); off by default,
	// so that no API key can aim the server at its own local services.
	// Link-local (cloud metadata) addresses are always refused.
	LoopbackRegistries bool
}

// WithDefaults returns b with its zero fields defaulted.
func (b Builds) WithDefaults() Builds {
	if b.Timeout == 0 {
		b.Timeout = 30 * time.Minute
	}
	if b.MaxContextBytes == 0 {
		b.MaxContextBytes = 1 * GiB
	}
	if b.MaxLayerBytes == 0 {
		b.MaxLayerBytes = 10 * GiB
	}
	if b.MaxPerKey == 0 {
		b.MaxPerKey = 2
	}
	if b.MaxConcurrent == 0 {
		b.MaxConcurrent = 4
	}
	return b
}

// buildsFromEnv overrides b by the KILN_BUILD_* and KILN_MAX_BUILDS*
// variables; malformed values become -1 for validate.
func buildsFromEnv(b Builds) Builds {
	if v := os.Getenv("KILN_BUILD_LOOPBACK_REGISTRIES"); v != "" {
		b.LoopbackRegistries = v == "1" || v == "true" || v == "on"
	}
	if v := os.Getenv("KILN_BUILD_TIMEOUT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			d = -1
		}
		b.Timeout = d
	}
	for _, f := range []struct {
		key string
		dst *int64
	}{{"KILN_BUILD_MAX_CONTEXT", &b.MaxContextBytes}, {"KILN_BUILD_MAX_LAYER", &b.MaxLayerBytes}} {
		if v := os.Getenv(f.key); v != "" {
			n, err := ParseBytes(v)
			if err != nil || n <= 0 {
				n = -1
			}
			*f.dst = n
		}
	}
	for _, f := range []struct {
		key string
		dst *int
	}{{"KILN_MAX_BUILDS_PER_KEY", &b.MaxPerKey}, {"KILN_MAX_BUILDS", &b.MaxConcurrent}} {
		if v := os.Getenv(f.key); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				n = -1
			}
			*f.dst = n
		}
	}
	return b
}

func (b Builds) validate() error {
	var errs []error
	if b.Timeout < 0 {
		errs = append(errs, errors.New("build timeout (KILN_BUILD_TIMEOUT) must be a positive duration such as 30m"))
	}
	if b.MaxContextBytes < 0 || b.MaxLayerBytes < 0 {
		errs = append(errs, errors.New("build limits (KILN_BUILD_MAX_CONTEXT, KILN_BUILD_MAX_LAYER) must be positive sizes such as 1G"))
	}
	if b.MaxPerKey < 0 || b.MaxConcurrent < 0 {
		errs = append(errs, errors.New("concurrent build limits (KILN_MAX_BUILDS_PER_KEY, KILN_MAX_BUILDS) must be positive numbers"))
	}
	return errors.Join(errs...)
}
