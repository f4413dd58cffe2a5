package image

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// TestServerGuard: a server's pulls reach no loopback registry unless the
// operator allows it, whether named by address or by a name that
// resolves there, and never a link-local (cloud metadata) address; the
// refusal happens before a connection is made and says why.
func TestServerGuard(t *testing.T) {
	host := startRegistry(t, nil)
	push(t, host+"/app:v1", platformImage(t, "linux", "amd64", "amd64"), nil)
	_, port, err := net.SplitHostPort(host)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		ref   string
		guard Guard
		ok    bool
	}{
		{"no guard", host + "/app:v1", nil, true},
		{"loopback allowed", host + "/app:v1", ServerGuard(true), true},
		{"loopback refused", host + "/app:v1", ServerGuard(false), false},
		{"loopback by name refused", "localhost:" + port + "/app:v1", ServerGuard(false), false},
		{"IPv6 loopback refused", "[::1]:" + port + "/app:v1", ServerGuard(false), false},
		{"metadata refused even with loopback allowed", "169.254.169.254/app:v1", ServerGuard(true), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			img, err := Pull(ctx, tc.ref, nil, tc.guard)
			if tc.ok {
				if err != nil {
					t.Fatalf("pull: %v", err)
				}
				if !slices.Contains(img.Config().Env, "MARKER=amd64") {
					t.Errorf("config env %v", img.Config().Env)
				}
				return
			}
			if !errors.Is(err, errdefs.ErrPermissionDenied) || !strings.Contains(err.Error(), "may not pull from") {
				t.Fatalf("err = %v, want a permission-denied refusal of the address", err)
			}
		})
	}
}
