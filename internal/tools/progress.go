package tools

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

const (
	// progressEvery spaces out progress notifications of output.
	progressEvery = 250 * time.Millisecond
	// heartbeatEvery is the interval of notifications while a call is
	// silent: clients reset their call timeouts on progress.
	heartbeatEvery = 10 * time.Second
	// maxProgressLine bounds a notification's message.
	maxProgressLine = 200
)

// notifier turns a call's output into MCP progress notifications: the
// last line of output at most every progressEvery, and a heartbeat every
// heartbeatEvery.
type notifier struct {
	ctx   context.Context
	req   *mcp.CallToolRequest
	token any
	start time.Time

	mu      sync.Mutex
	n       int
	sent    time.Time
	pending string // the last line not yet sent
}

// progress returns the Progress of a tool call and a function that stops
// its heartbeat (call it before answering, so that no notification follows
// the result); without a progress token in the request, a nil Progress.
func progress(ctx context.Context, req *mcp.CallToolRequest) (Progress, func()) {
	token := req.Params.GetProgressToken()
	if token == nil {
		return nil, func() {}
	}
	n := &notifier{ctx: ctx, req: req, token: token, start: time.Now()}
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(heartbeatEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				n.mu.Lock()
				msg := fmt.Sprintf("running for %s", time.Since(n.start).Round(time.Second))
				if n.pending != "" {
					msg += ": " + n.pending
				}
				n.send(msg)
				n.mu.Unlock()
			}
		}
	}()
	return n.output, func() { close(done); <-stopped }
}

// output notes a chunk of output; it sends its last line unless one was
// sent very recently.
func (n *notifier) output(chunk string) {
	lines := strings.Split(strings.TrimRight(chunk, "\n"), "\n")
	line := strings.TrimSpace(lines[len(lines)-1])
	if line == "" {
		return
	}
	if len(line) > maxProgressLine {
		line = strings.ToValidUTF8(line[:maxProgressLine], "") + "…"
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.pending = line
	if time.Since(n.sent) >= progressEvery {
		n.send(line)
	}
}

// send notifies the client; n.mu is held. Failures are ignored: progress
// is advisory.
func (n *notifier) send(msg string) {
	n.n++
	n.sent, n.pending = time.Now(), ""
	_ = n.req.Session.NotifyProgress(n.ctx, &mcp.ProgressNotificationParams{
		ProgressToken: n.token, Progress: float64(n.n), Message: msg,
	})
}
