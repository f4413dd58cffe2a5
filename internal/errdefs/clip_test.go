package errdefs

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestClip(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"", 4, ""},
		{"abcd", 4, "abcd"},
		{"abcde", 4, "abcd…"},
		{"ab€d", 3, "ab…"}, // € is 3 bytes: never cut inside it
		{"€€", 4, "€…"},
	} {
		if got := ClipN(tc.in, tc.n); got != tc.want {
			t.Errorf("ClipN(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
	msg := ClipMessage("executable \""+strings.Repeat("x", 100<<10)+"\" not found", 1024)
	if len(msg) > 1024+len("…") || !strings.HasPrefix(msg, "executable \"xx") || !strings.HasSuffix(msg, "x\" not found") {
		t.Errorf("ClipMessage: %d bytes, %.40q…%q", len(msg), msg, msg[len(msg)-20:])
	}
	big := strings.Repeat("é", 100<<10)
	got := Clip(big)
	if len(got) > MaxEcho+len("…") || !utf8.ValidString(got) {
		t.Errorf("Clip of 200 KB: %d bytes, valid UTF-8 %v", len(got), utf8.ValidString(got))
	}
}
