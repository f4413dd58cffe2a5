package sandbox

import (
	"fmt"
	"strings"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// What a caller may pass to a process or an upload: the same limits on
// every API (native and E2B), checked by the functions below.
const (
	// MaxEnvVars bounds a process's own environment variables.
	MaxEnvVars = 256
	// MaxTag bounds a process's tag.
	MaxTag = 256
	// MaxUploadFiles bounds the files of one multipart upload.
	MaxUploadFiles = 1000
)

// CheckEnv validates environment variables a caller gives a process:
// at most MaxEnvVars, names of 1-256 bytes without '=' or NUL and not in
// the reserved KILN_ namespace, values of at most 32 KiB without NUL.
func CheckEnv(env map[string]string) error {
	if len(env) > MaxEnvVars {
		return fmt.Errorf("env: more than %d variables: %w", MaxEnvVars, errdefs.ErrInvalidArgument)
	}
	for k, v := range env {
		switch {
		case k == "" || len(k) > 256 || len(v) > 32<<10:
			return fmt.Errorf("env %q: name must be 1-256 bytes and value at most 32 KiB: %w", errdefs.ClipN(k, 64), errdefs.ErrInvalidArgument)
		case strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0):
			return fmt.Errorf("env %q: names may not contain '=' or NUL, values not NUL: %w", errdefs.ClipN(k, 64), errdefs.ErrInvalidArgument)
		case strings.HasPrefix(k, "KILN_"):
			return fmt.Errorf("env %q: the KILN_ prefix is reserved: %w", errdefs.ClipN(k, 64), errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// CheckTag validates a process's tag.
func CheckTag(tag string) error {
	switch {
	case len(tag) > MaxTag:
		return fmt.Errorf("tag longer than %d bytes: %w", MaxTag, errdefs.ErrInvalidArgument)
	case strings.ContainsRune(tag, 0):
		return fmt.Errorf("tag contains a NUL byte: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}
