package builder

import (
	"fmt"
	"strings"
	"testing"
)

// TestTail: a failure's tail keeps the last lines, and an error line that
// arrived before the last stdout lines (two pipes, no order between them)
// is not pushed out by them.
func TestTail(t *testing.T) {
	tests := []struct {
		name      string
		feed      func(t *tail)
		want      []string // in the tail
		wantNot   []string
		wantLines int
	}{
		{"stdout only", func(t *tail) {
			for i := 1; i <= 40; i++ {
				t.add(fmt.Sprintf("line%d", i))
			}
		}, []string{"line21", "line40"}, []string{"line20"}, 20},
		{"stderr first, then more stdout than the window", func(t *tail) {
			for i := 1; i <= 10; i++ {
				t.add(fmt.Sprintf("line%d", i))
			}
			t.addErr("E: Unable to locate package nosuch")
			for i := 11; i <= 40; i++ {
				t.add(fmt.Sprintf("line%d", i))
			}
		}, []string{"line40", "line21", "E: Unable to locate package nosuch"}, []string{"line20"}, 21},
		{"stderr in the window is not repeated", func(t *tail) {
			t.add("a")
			t.addErr("boom")
			t.add("b")
		}, []string{"a", "boom", "b"}, nil, 3},
	}
	for _, tt := range tests {
		tl := newTail()
		tt.feed(tl)
		got := tl.String()
		for _, w := range tt.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: %q lacks %q", tt.name, got, w)
			}
		}
		for _, w := range tt.wantNot {
			if strings.Contains(got, w+"\n") || strings.HasSuffix(got, w) {
				t.Errorf("%s: %q has %q", tt.name, got, w)
			}
		}
		if n := len(strings.Split(got, "\n")); n != tt.wantLines {
			t.Errorf("%s: %d lines, want %d: %q", tt.name, n, tt.wantLines, got)
		}
	}
}
