package process

import (
	"log/slog"
	"testing"

	"golang.org/x/sys/unix"
)

// The reap loop's safety-net wakeup exists only while children the agent
// started run: an idle agent must not wake on a timer (each wakeup costs
// an idle runsc sandbox host CPU).
func TestReaperSafetyNetOnlyWithChildren(t *testing.T) {
	r := &reaper{log: slog.Default(), waiters: map[int]exitFunc{}, stop: make(chan struct{})}
	if c, stop := r.safetyNet(); c != nil {
		stop()
		t.Fatal("no children: the reap loop has a timer")
	}
	r.waiters[12345] = func(unix.WaitStatus) {}
	c, stop := r.safetyNet()
	defer stop()
	if c == nil {
		t.Fatal("a child runs: the reap loop has no safety net")
	}
	<-c // it fires
}
