package process

import (
	"strings"
	"testing"
	"time"
)

// replayBytes is the replay memory the table's logs hold.
func (t *Table) replayBytes() (total int64) {
	t.mu.Lock()
	ps := append(t.runningLocked(), t.ended...)
	t.mu.Unlock()
	for _, p := range ps {
		p.log.mu.Lock()
		total += p.log.size
		p.log.mu.Unlock()
	}
	return total
}

// Many detached processes that print a lot share the replay pool: their
// buffers together stay within the pool plus minReplay each (without the
// pool each kept its 1 MiB: 40 MiB here), and an attached process still
// gets every byte.
func TestReplayPoolBoundsMemory(t *testing.T) {
	const n, pool = 40, 2 << 20
	tbl := newTable(t, Options{ReplayBytes: 1 << 20, ReplayPool: pool})
	var ps []*Process
	for range n {
		p, sub, err := tbl.Start(Spec{Args: []string{"sh", "-c", "head -c 1048576 /dev/zero; echo done; sleep 60"}, User: self()})
		if err != nil {
			t.Fatal(err)
		}
		sub.Close() // detached, like a background command
		ps = append(ps, p)
	}
	// Wait until each has printed everything.
	for _, p := range ps {
		deadline := time.Now().Add(60 * time.Second)
		for {
			p.log.mu.Lock()
			done := p.log.nextSeq > 1 && p.log.outBytes >= 1<<20+5
			p.log.mu.Unlock()
			if done {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("process %d did not print its output", p.pid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	bound := int64(pool + n*minReplay + n*eventCost(out(readChunk)))
	if got := tbl.replayBytes(); got > bound {
		t.Errorf("%d detached processes hold %d KiB of replay; want at most %d KiB", n, got>>10, bound>>10)
	}
	if used := tbl.replay.used.Load(); used != tbl.replayBytes() {
		t.Errorf("pool accounts %d bytes, the logs hold %d", used, tbl.replayBytes())
	}
	// An attached process is served in full while the pool is exhausted.
	_, sub, err := tbl.Start(Spec{Args: []string{"sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' x"}, User: self()})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	got, st := follow(t, sub)
	if len(got) != 3000000 || strings.Trim(got, "x") != "" || st.Code != 0 {
		t.Errorf("attached process got %d bytes, exit %+v; want 3000000", len(got), st)
	}
	for _, p := range ps {
		_ = p.Signal("KILL")
	}
}
