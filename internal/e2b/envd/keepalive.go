package envd

import (
	"strconv"
	"sync"
	"time"
)

// defaultKeepalive is envd's keepalive period when the client names none.
const defaultKeepalive = 90 * time.Second

type headerGetter interface{ Get(key string) string }

// keepaliveInterval reads the client's Keepalive-Ping-Interval (seconds).
func keepaliveInterval(h headerGetter) time.Duration {
	n, err := strconv.Atoi(h.Get("Keepalive-Ping-Interval"))
	if err != nil || n <= 0 {
		return defaultKeepalive
	}
	return time.Duration(n) * time.Second
}

// keepalive calls ping whenever d passes without a signal on reset, until
// ping fails or stop is called; stop waits for a running ping to finish,
// so nothing is sent after it returns.
func keepalive(d time.Duration, reset <-chan struct{}, ping func() error) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTimer(d)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-reset:
				t.Reset(d)
			case <-t.C:
				if ping() != nil {
					return
				}
				t.Reset(d)
			}
		}
	})
	var once sync.Once
	return func() {
		once.Do(func() { close(done) })
		wg.Wait()
	}
}
