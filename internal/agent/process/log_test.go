package process

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"golang.org/x/sys/unix"
)

func sigName(s unix.Signal) string { return unix.SignalName(s) }

func out(n int) api.Event { return api.Event{Type: api.EventStdout, Data: make([]byte, n)} }

// With nobody attached, old events are dropped; a late subscriber gets
// what remains, with a gap in seq.
func TestLogDropsWhenDetached(t *testing.T) {
	l := newEventLog(10_000, 0, nil)
	l.appendEvent(api.Event{Type: api.EventStart})
	for range 100 {
		l.appendOutput(out(1000)) // never blocks: nobody attached
	}
	l.appendEvent(api.Event{Type: api.EventExit, Exit: &api.ExitStatus{Code: 1}})
	sub := l.subscribe(0)
	defer sub.Close()
	var seqs []uint64
	st, err := sub.Follow(context.Background(), func(ev api.Event) error {
		seqs = append(seqs, ev.Seq)
		return nil
	})
	if err != nil || st.Code != 1 {
		t.Fatalf("follow: %+v, %v", st, err)
	}
	if len(seqs) > 10 || seqs[len(seqs)-1] != 102 || seqs[0] == 1 {
		t.Errorf("replayed seqs %v: want only the newest, ending with the exit at 102", seqs)
	}
}

// An attached subscriber misses nothing: appending waits for it.
func TestLogBackpressure(t *testing.T) {
	l := newEventLog(10_000, 0, nil)
	sub := l.subscribe(0)
	defer sub.Close()
	done := make(chan struct{})
	go func() {
		for range 100 {
			l.appendOutput(out(1000))
		}
		l.appendEvent(api.Event{Type: api.EventExit, Exit: &api.ExitStatus{}})
		close(done)
	}()
	select {
	case <-done:
		t.Fatal("appending 100 KB into a 10 KB buffer did not wait for the subscriber")
	case <-time.After(50 * time.Millisecond):
	}
	next := uint64(1)
	_, err := sub.Follow(context.Background(), func(ev api.Event) error {
		if ev.Seq != next {
			t.Fatalf("got seq %d, want %d", ev.Seq, next)
		}
		next++
		return nil
	})
	if err != nil || next != 102 {
		t.Fatalf("follow ended at %d: %v", next, err)
	}
	<-done
}

// Output beyond the cap is cut and remembered.
func TestLogOutputCap(t *testing.T) {
	l := newEventLog(1<<20, 2500, nil)
	for range 3 {
		l.appendOutput(out(1000))
	}
	var n int
	for _, ev := range l.events {
		n += len(ev.Data)
	}
	if n != 2500 || !l.outputState() || len(l.events) != 3 {
		t.Errorf("kept %d bytes in %d events, truncated %v", n, len(l.events), l.outputState())
	}
}

// Output a pipe holds when the drain deadline has already passed (a reader
// woken late on a loaded host) is still read, not dropped.
func TestReadLoopDrainsAfterDeadline(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if _, err := w.WriteString("last words\n"); err != nil {
		t.Fatal(err)
	}
	if err := r.SetReadDeadline(time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	p := &Process{log: newEventLog(1<<20, 0, nil)}
	p.readLoop(r, api.EventStdout) // must return: the writer is still open
	var got string
	for _, ev := range p.log.events {
		got += string(ev.Data)
	}
	if got != "last words\n" {
		t.Errorf("read %q, want the buffered output", got)
	}
}
