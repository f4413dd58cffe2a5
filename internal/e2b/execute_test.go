package e2b_test

import (
	"net/http"
	"strings"
	"testing"
)

// TestExecuteBadEnv: env_vars the native API refuses are refused by
// /execute too, with 400 and a short message (they were a 500 from the
// agent). The native twin is server's TestCodeValidation.
func TestExecuteBadEnv(t *testing.T) {
	h := newHarness(t, "code-interpreter")
	sb := h.create(h.a, map[string]any{"templateID": "code-interpreter"})
	for _, tc := range []struct {
		name string
		env  map[string]string
		msg  string
	}{
		{"NUL in a value", map[string]string{"A": "b\x00c"}, "NUL"},
		{"NUL in a name", map[string]string{"A\x00": "b"}, "NUL"},
		{"= in a name", map[string]string{"A=B": "c"}, "'='"},
		{"empty name", map[string]string{"": "c"}, "1-256"},
		{"reserved name", map[string]string{"KILN_X": "c"}, "KILN_"},
		{"100 KB name", map[string]string{strings.Repeat("x", 100<<10): "c"}, "1-256"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, _, b := h.call("POST", "/execute", map[string]any{"code": "1", "env_vars": tc.env}, jupyter(sb, true)...)
			if status != http.StatusBadRequest || !strings.Contains(string(b), tc.msg) || !strings.HasPrefix(string(b), "env_vars") || len(b) > 300 {
				t.Errorf("%d %.300q, want 400 with %q", status, b, tc.msg)
			}
		})
	}
	if lines, status := execute(h, sb, map[string]any{"code": "import os\nos.environ['OK']", "env_vars": map[string]string{"OK": "fine"}}); status != http.StatusOK || mainText(lines) != "fine" {
		t.Errorf("valid env_vars: %d %v", status, lines)
	}
}
