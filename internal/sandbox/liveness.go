package sandbox

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/kiln-sh/kiln/internal/agentapi/channel"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/oci"
)

// reasonUnresponsive is the failure reason of a sandbox whose agent
// stopped answering: short, and without the agent's log (whose tail may be
// a Go stack dump).
const reasonUnresponsive = "agent unresponsive"

// A sandbox busy while its agent leaves pings unanswered is starved (a
// fork bomb shares its CPU with the agent until the agent's guard kills
// it), not frozen: it is failed only once it has been unresponsive for
// starvedLimit. Busy means its cgroup used more than busyShare of a CPU
// since the pings went unanswered; a stopped agent with nothing else
// running uses next to none.
const (
	starvedLimit = 5 * time.Minute
	busyShare    = 0.1
)

// liveness pings the agent of a running sandbox every interval on session
// conn (config.Liveness), or less often when so many sandboxes run that
// their pings together would pass the max rate (pingEvery). A sandbox whose agent leaves Misses pings in a
// row unanswered, each within interval, while the sandbox is idle (or for
// starvedLimit while it is busy) is failed ("agent unresponsive")
// and destroyed as one whose channel ended is (see watch): an agent
// stopped by SIGSTOP, or wedged, would otherwise leave the sandbox
// "running" while every call hangs until its own timeout.
//
// Each ping is sent and awaited under b.mu, which every lifecycle change
// holds throughout (pause, resume, fork and snapshot captures, destroy),
// so a sandbox frozen on purpose is never pinged: the pinger waits for
// the operation, then finds the sandbox paused (skipped), its session
// replaced (it stops) or running and thawed. A ping stuck in the channel
// (the agent not reading its FIFO) is not repeated: it stays in flight and
// each further round counts a miss. The pinger ends with the session.
func (m *Manager) liveness(b *box, conn *channel.Conn) {
	interval, misses := m.cfg.Liveness.Interval, m.cfg.Liveness.Misses
	if interval <= 0 || misses <= 0 {
		return
	}
	m.pingers.Add(1)
	defer m.pingers.Add(-1)
	every := pingEvery(interval, m.pingers.Load(), m.cfg.Liveness.MaxRate)
	tick := time.NewTicker(every)
	defer tick.Stop()
	var inflight chan error // the unanswered ping, if any
	missed := 0
	var since time.Time // the first miss of the current run
	var cpuSince time.Duration
	for {
		select {
		case <-conn.Done():
			return
		case <-m.done:
			return
		case <-tick.C:
		}
		if e := pingEvery(interval, m.pingers.Load(), m.cfg.Liveness.MaxRate); e != every {
			every = e
			tick.Reset(every)
		}
		b.mu.Lock()
		if b.conn != conn {
			b.mu.Unlock()
			return
		}
		if b.rec.State != StateRunning {
			missed = 0 // paused (runc keeps the session): nothing to answer
			b.mu.Unlock()
			continue
		}
		if inflight == nil {
			inflight = make(chan error, 1)
			go ping(conn, interval, inflight)
		}
		timer := time.NewTimer(interval)
		select {
		case err := <-inflight:
			inflight = nil
			if err == nil {
				missed = 0
			} else {
				missed++
			}
		case <-timer.C:
			missed++
		case <-conn.Done():
		}
		timer.Stop()
		if missed == 1 {
			since, cpuSince = time.Now(), m.cpuUsage(b.rec.ID)
		}
		if missed >= misses && !ended(conn) {
			silent := time.Since(since)
			busy := float64(m.cpuUsage(b.rec.ID)-cpuSince) > busyShare*float64(silent)
			if !busy || silent >= starvedLimit {
				m.failUnresponsive(b, fmt.Sprintf("%d pings in a row unanswered within %s (%s, busy %v)", missed, interval, silent.Round(time.Second), busy))
				b.mu.Unlock()
				return
			}
		}
		b.mu.Unlock()
	}
}

// pingEvery is how often each of n pinged sandboxes is pinged: every
// interval, or less often when n sandboxes pinged that often would send
// more than maxRate pings a second together (maxRate 0: no bound). Each
// ping's deadline stays interval: a slower round trip is a miss whatever
// the count.
func pingEvery(interval time.Duration, n int64, maxRate float64) time.Duration {
	if maxRate <= 0 || n <= 0 {
		return interval
	}
	return max(interval, time.Duration(math.Ceil(float64(n)*float64(time.Second)/maxRate)))
}

// ended reports whether conn's session is over (then watch handles it).
func ended(conn *channel.Conn) bool {
	select {
	case <-conn.Done():
		return true
	default:
		return false
	}
}

// ping sends one ping on conn and reports how it ended.
func ping(conn *channel.Conn, timeout time.Duration, done chan<- error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var p wire.Pong
	done <- conn.Invoke(ctx, wire.MethodPing, struct{}{}, &p)
}

// failUnresponsive fails and destroys a sandbox whose agent stopped
// answering; a pooled one nobody claimed yet has no record, and closing
// its session makes the pool discard it (see watchUnlisted). Callers hold
// b.mu and have checked that b runs on the session that stopped.
func (m *Manager) failUnresponsive(b *box, detail string) {
	id := b.rec.ID
	m.log.Warn("sandbox agent unresponsive; failing the sandbox", "sandbox_id", id, "detail", detail)
	if listed, err := m.box(id); err != nil || listed != b {
		b.conn.Close()
		b.conn = nil
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := m.destroyLocked(ctx, b, StateFailed, reasonUnresponsive); err != nil && !errors.Is(err, errdefs.ErrFailedPrecondition) {
		m.log.Error("cleaning up unresponsive sandbox", "sandbox_id", id, "err", err)
	}
}

// cpuUsage is the CPU time a sandbox's cgroup has used (0 if unknown).
func (m *Manager) cpuUsage(id ID) time.Duration {
	st, err := oci.CgroupStats(cgroupsPath(id))
	if err != nil {
		return 0
	}
	return st.CPUUsage
}
