package main

import (
	"bytes"
	"fmt"
	"sync"
	"testing"
)

// TestLinePrefixer: concurrent builds' output interleaves by whole lines,
// each carrying its template's prefix, however the writes were split.
func TestLinePrefixer(t *testing.T) {
	var (
		out bytes.Buffer
		mu  sync.Mutex
		wg  sync.WaitGroup
	)
	want := map[string]int{}
	for _, name := range []string{"base", "code-interpreter"} {
		p := &linePrefixer{mu: &mu, w: &out, prefix: name + " | "}
		for i := range 200 {
			want[fmt.Sprintf("%s | line %d of %s", name, i, name)]++
		}
		want[name+" | unterminated"]++
		wg.Go(func() {
			defer p.flush()
			for i := range 200 {
				l := fmt.Sprintf("line %d of %s\n", i, name)
				p.Write([]byte(l[:3]))
				p.Write([]byte(l[3:]))
			}
			p.Write([]byte("unterminated"))
		})
	}
	wg.Wait()
	got := map[string]int{}
	for _, l := range bytes.Split(bytes.TrimSuffix(out.Bytes(), []byte("\n")), []byte("\n")) {
		got[string(l)]++
	}
	if len(got) != len(want) {
		t.Fatalf("got %d distinct lines, want %d:\n%s", len(got), len(want), out.String())
	}
	for l, n := range want {
		if got[l] != n {
			t.Errorf("line %q: %d times, want %d", l, got[l], n)
		}
	}
}
