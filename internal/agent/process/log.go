package process

import (
	"context"
	"slices"
	"sync"

	"github.com/kiln-sh/kiln/api"
)

// eventCost is what one event counts against the replay budget: its data
// plus a fixed overhead, so that floods of tiny events are bounded too.
func eventCost(ev api.Event) int64 { return int64(len(ev.Data)) + 128 }

// eventLog is a process's numbered events: a bounded replay buffer that
// subscribers follow. Appending waits while the oldest retained event has
// not yet been delivered to an attached subscriber (so an attached client
// sees every event, at the pace it reads); with no subscriber attached the
// oldest events are dropped instead, and the process never blocks.
//
// It also enforces the output cap: output beyond it is dropped and
// remembered as truncation.
type eventLog struct {
	mu      sync.Mutex
	changed chan struct{} // closed and replaced whenever state changes
	waiting int           // appenders blocked on a pinned event
	events  []api.Event   // contiguous seqs, oldest first
	size    int64         // sum of eventCost over events
	limit   int64         // replay budget
	pool    *replayPool   // shared by the table's logs; nil: none
	nextSeq uint64
	subs    map[*Subscription]struct{}

	outLimit  int64 // cap on stdout+stderr bytes, 0 = none
	outBytes  int64
	truncated bool
}

func newEventLog(limit, outLimit int64, pool *replayPool) *eventLog {
	return &eventLog{
		pool:     pool,
		changed:  make(chan struct{}),
		limit:    limit,
		nextSeq:  1,
		subs:     make(map[*Subscription]struct{}),
		outLimit: outLimit,
	}
}

// wakeLocked tells every waiter that something changed.
func (l *eventLog) wakeLocked() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// floorLocked is the highest seq every subscriber has already received:
// events up to it may be dropped.
func (l *eventLog) floorLocked() uint64 {
	floor := ^uint64(0)
	for s := range l.subs {
		floor = min(floor, s.cursor)
	}
	return floor
}

// appendOutput adds output of type typ, cut to what remains of the output
// cap. It blocks while an attached subscriber lags a full replay budget
// behind.
func (l *eventLog) appendOutput(ev api.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.outLimit > 0 {
		room := l.outLimit - l.outBytes
		if int64(len(ev.Data)) > room {
			l.truncated = true
			ev.Data = ev.Data[:max(room, 0)]
		}
		if len(ev.Data) == 0 {
			return
		}
		l.outBytes += int64(len(ev.Data))
	}
	l.appendLocked(ev, true)
}

// appendEvent adds a non-output event (start, exit) without waiting; it
// may exceed the budget rather than drop what a subscriber still needs.
func (l *eventLog) appendEvent(ev api.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.appendLocked(ev, false)
}

func (l *eventLog) appendLocked(ev api.Event, block bool) {
	c := eventCost(ev)
	for {
		room := l.pool.room(l.size, l.limit)
		l.evictLocked(room - c)
		if !block || len(l.events) == 0 || l.size+c <= room {
			break
		}
		ch := l.changed
		l.waiting++
		l.mu.Unlock()
		<-ch
		l.mu.Lock()
		l.waiting--
	}
	ev.Seq = l.nextSeq
	l.nextSeq++
	l.events = append(l.events, ev)
	l.size += c
	l.pool.add(c)
	l.wakeLocked()
}

// evictLocked drops the oldest events that every subscriber has received
// until the log's size is at most size.
func (l *eventLog) evictLocked(size int64) {
	floor := l.floorLocked()
	for len(l.events) > 0 && l.size > size && l.events[0].Seq <= floor {
		l.size -= eventCost(l.events[0])
		l.pool.add(-eventCost(l.events[0]))
		l.events[0] = api.Event{}
		l.events = l.events[1:]
	}
}

// release gives the log's memory back to the pool (the log is forgotten).
func (l *eventLog) release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pool.add(-l.size)
	l.pool = nil
}

// shrink lowers the replay budget of an ended process's log.
func (l *eventLog) shrink(limit int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.limit = min(l.limit, limit)
	l.evictLocked(l.limit)
	l.events = slices.Clip(l.events)
}

// outputState reports whether output was truncated.
func (l *eventLog) outputState() (truncated bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.truncated
}

// subscribe registers a subscriber that has seen events up to afterSeq.
func (l *eventLog) subscribe(afterSeq uint64) *Subscription {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := &Subscription{log: l, cursor: min(afterSeq, l.nextSeq-1)}
	l.subs[s] = struct{}{}
	return s
}

// Subscription follows a process's events: first those still buffered
// after its starting point, then live ones until the exit event.
type Subscription struct {
	log    *eventLog
	cursor uint64 // last seq delivered; guarded by log.mu
	closed bool
}

// Close detaches the subscriber; the process keeps running.
func (s *Subscription) Close() {
	l := s.log
	l.mu.Lock()
	defer l.mu.Unlock()
	if !s.closed {
		s.closed = true
		delete(l.subs, s)
		l.wakeLocked()
	}
}

// Follow calls emit for every event in order until it has delivered the
// exit event, whose status it returns. Events dropped from the replay
// buffer before they were delivered show as a gap in Seq. It returns early
// with emit's error or when ctx is done.
func (s *Subscription) Follow(ctx context.Context, emit func(api.Event) error) (api.ExitStatus, error) {
	l := s.log
	for {
		l.mu.Lock()
		var batch []api.Event
		if n := len(l.events); n > 0 {
			first := l.events[0].Seq
			s.cursor = max(s.cursor, first-1)
			i := int(s.cursor + 1 - first)
			if i < n {
				batch = append(batch, l.events[i:min(n, i+64)]...)
			}
		}
		ch := l.changed
		l.mu.Unlock()
		if len(batch) == 0 {
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return api.ExitStatus{}, ctx.Err()
			}
		}
		for _, ev := range batch {
			if err := emit(ev); err != nil {
				return api.ExitStatus{}, err
			}
			l.mu.Lock()
			s.cursor = ev.Seq
			if l.waiting > 0 {
				l.wakeLocked()
			}
			l.mu.Unlock()
			if ev.Type == api.EventExit && ev.Exit != nil {
				return *ev.Exit, nil
			}
		}
	}
}
