package server_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/client"
	"github.com/kiln-sh/kiln/internal/sandbox/sandboxtest"
)

// TestTemplatePushRefusals: a push without an image, to an over-long or
// malformed reference, or of a template the key cannot see is refused
// with the class that says why, before anything is read or sent. (A push
// that succeeds: builder's TestPushTemplate.)
func TestTemplatePushRefusals(t *testing.T) {
	_, a, _, _ := templateHarness(t, sandboxtest.Runtimes[0], harnessOpts{})
	ctx := testCtx(t)
	for _, tc := range []struct {
		name, ref, image string
		status           int
		msg              string
	}{
		{"no image", "base", "", http.StatusBadRequest, "image is required"},
		{"over-long image", "base", "127.0.0.1:1/" + strings.Repeat("a", 600), http.StatusBadRequest, "at most 512"},
		{"malformed image", "base", "Not A Ref!", http.StatusBadRequest, "malformed image reference"},
		{"unknown template", "nope", "127.0.0.1:1/x:v1", http.StatusNotFound, "nope"},
		{"bad template reference", "Bad:Ref:x", "127.0.0.1:1/x:v1", http.StatusBadRequest, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := a.PushTemplate(ctx, tc.ref, api.TemplatePushRequest{Image: tc.image})
			var ce *client.Error
			if !errors.As(err, &ce) || ce.Status != tc.status || !strings.Contains(ce.Message, tc.msg) {
				t.Fatalf("push %s to %q: %v, want %d with %q", tc.ref, tc.image, err, tc.status, tc.msg)
			}
		})
	}
}
