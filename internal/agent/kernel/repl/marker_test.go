package repl

import (
	"strings"
	"testing"
)

func TestSplitter(t *testing.T) {
	m := func(p string) string { return "\x02kiln-tok-" + p + "\x03" }
	tests := []struct {
		name   string
		chunks []string
		want   string // data, with markers shown as <payload>
	}{
		{"plain", []string{"hello"}, "hello"},
		{"marker", []string{"a" + m("1:0") + "b"}, "a<1:0>b"},
		{"split marker", []string{"a\x02ki", "ln-tok-1", "2\x03b"}, "a<12>b"},
		{"byte by byte", strings.Split("x"+m("7")+"y", ""), "x<7>y"},
		{"lone start byte", []string{"a\x02b"}, "a\x02b"},
		{"other token", []string{"\x02kiln-other-1\x03"}, "\x02kiln-other-1\x03"},
		{"unterminated", []string{"\x02kiln-tok-" + strings.Repeat("z", 200)}, "\x02kiln-tok-" + strings.Repeat("z", 200)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := splitter{prefix: markerPrefix("tok")}
			var got strings.Builder
			for _, c := range tt.chunks {
				s.feed([]byte(c), func(b []byte) { got.Write(b) }, func(p string) { got.WriteString("<" + p + ">") })
			}
			got.Write(s.buf)
			if got.String() != tt.want {
				t.Errorf("got %q, want %q", got.String(), tt.want)
			}
		})
	}
}
