package sandbox

import (
	"testing"
	"time"
)

// The pings of all sandboxes together stay under the max rate: each is
// pinged every interval until that many would exceed it, then less often.
func TestPingEvery(t *testing.T) {
	for _, c := range []struct {
		n    int64
		rate float64
		want time.Duration
	}{
		{0, 100, 2 * time.Second},
		{1, 100, 2 * time.Second},
		{200, 100, 2 * time.Second}, // 100 pings/s: at the bound
		{201, 100, 2010 * time.Millisecond},
		{1000, 100, 10 * time.Second}, // 100 pings/s, not 500
		{1000, 0, 2 * time.Second},    // no bound
		{50, 10, 5 * time.Second},
	} {
		if got := pingEvery(2*time.Second, c.n, c.rate); got != c.want {
			t.Errorf("pingEvery(2s, %d, %v) = %v, want %v", c.n, c.rate, got, c.want)
		}
		if c.rate > 0 && c.n > 0 {
			if rate := float64(c.n) / pingEvery(2*time.Second, c.n, c.rate).Seconds(); rate > c.rate+1e-9 {
				t.Errorf("%d sandboxes send %.1f pings/s, over %v", c.n, rate, c.rate)
			}
		}
	}
}
