package process

import "sync/atomic"

// Bounds of the replay memory all processes share.
const (
	// minReplay is the replay buffer every process may keep whatever the
	// pool says: enough for a few output events, so an attached client is
	// always served.
	minReplay = 64 << 10
	// Replay pool sizes: a sixteenth of the sandbox's memory, within these
	// bounds; defaultReplayPool when the memory limit is unknown.
	minReplayPool     = 8 << 20
	maxReplayPool     = 256 << 20
	defaultReplayPool = 64 << 20
)

// replayPool is the budget of replay memory shared by every process of a
// table. A process's buffer grows past minReplay (up to its own limit,
// Options.ReplayBytes) only while the pool has room; once it has none,
// every process that appends output is held to minReplay, dropping its
// oldest events that nobody attached still needs (a detached process loses
// replay, never output an attached client has not read). So the agent's
// replay memory stays below the pool plus minReplay per process, whatever
// number of background processes print.
type replayPool struct {
	budget int64
	used   atomic.Int64 // sum of the sizes of every log
}

// replayPoolSize is the pool for a sandbox with this memory limit (0:
// unknown).
func replayPoolSize(memoryLimit int64) int64 {
	if memoryLimit <= 0 {
		return defaultReplayPool
	}
	return min(max(memoryLimit/16, minReplayPool), maxReplayPool)
}

// room is how large a log of size size may grow, given its own limit.
func (p *replayPool) room(size, limit int64) int64 {
	if p == nil {
		return limit
	}
	free := p.budget - p.used.Load()
	return min(limit, max(minReplay, size+free))
}

func (p *replayPool) add(n int64) {
	if p != nil {
		p.used.Add(n)
	}
}
