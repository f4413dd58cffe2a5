package jupyter

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agent/kernel"
)

// silentTimeout bounds the silent executions that set and restore a
// per-execution environment.
const silentTimeout = 10 * time.Second

type executeRequest struct {
	Code            string         `json:"code"`
	Silent          bool           `json:"silent"`
	StoreHistory    bool           `json:"store_history"`
	UserExpressions map[string]any `json:"user_expressions"`
	AllowStdin      bool           `json:"allow_stdin"`
	// StopOnError stays false: requests are sent one at a time, and a
	// true value makes ipykernel abort the request right after an error.
	StopOnError bool `json:"stop_on_error"`
}

type executeReply struct {
	Status         string   `json:"status"`
	ExecutionCount int      `json:"execution_count"`
	EName          string   `json:"ename"`
	EValue         string   `json:"evalue"`
	Traceback      []string `json:"traceback"`
}

type streamContent struct {
	Name string `json:"name"`
	Text string `json:"text"`
}

type displayContent struct {
	Data map[string]json.RawMessage `json:"data"`
}

type errorContent struct {
	EName     string   `json:"ename"`
	EValue    string   `json:"evalue"`
	Traceback []string `json:"traceback"`
}

type statusContent struct {
	State string `json:"execution_state"`
	// Reply is the execute_reply's content that Kiln's Python kernel
	// puts in the status idle that ends an execution
	// (python_startup.py, _kiln_reply_in_idle), so the agent need not
	// wait for the reply itself, which comes later.
	Reply json.RawMessage `json:"kiln_execute_reply"`
}

// Execute runs code and emits its stream output, rich results and error
// as events. A kernel that died since the last execution is relaunched
// first; one that dies during this execution makes it fail with
// kernel.ErrDied.
func (k *Kernel) Execute(ctx context.Context, code string, env map[string]string, emit func(api.Event) error) (int, error) {
	k.exec.Lock()
	defer k.exec.Unlock()
	in, err := k.liveInstance(ctx)
	if err != nil {
		return 0, err
	}
	if len(env) > 0 {
		if k.spec.SetEnv == nil {
			return 0, &api.Error{Code: api.CodeInvalidArgument, Message: "the " + k.spec.Language + " kernel does not take per-execution environment variables"}
		}
		set, restore := k.spec.SetEnv(env)
		if err := in.silent(ctx, set); err != nil {
			return 0, fmt.Errorf("setting the execution's environment: %w", err)
		}
		defer func() {
			if in.alive() {
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), silentTimeout)
				defer cancel()
				_ = in.silent(rctx, restore)
			}
		}()
	}
	// A hidden execution stays out of the history, and so out of the
	// execution count.
	id, err := in.send(in.shell, "execute_request", executeRequest{Code: code, StoreHistory: !kernel.IsHidden(ctx),
		UserExpressions: map[string]any{}})
	if err != nil {
		return 0, err
	}
	return k.follow(ctx, in, id, emit)
}

// follow collects the messages of one execution until the kernel is idle
// and has replied.
func (k *Kernel) follow(ctx context.Context, in *instance, id string, emit func(api.Event) error) (int, error) {
	var (
		count          int
		idle, replied  bool
		stopErr        error // why the execution was interrupted
		clientGone     bool
		sawError       bool
		replyErr       *api.Event // the reply's error, sent if no error message came
		done           = ctx.Done()
		resend, giveUp <-chan time.Time
		stopTicker     func()
	)
	interrupt := func(why error) {
		if stopErr != nil {
			return
		}
		stopErr, done = why, nil
		_ = in.proc.Signal(syscall.SIGINT)
		t := time.NewTicker(time.Second)
		resend, giveUp = t.C, time.After(interruptGrace)
		stopTicker = t.Stop
	}
	defer func() {
		if stopTicker != nil {
			stopTicker()
		}
	}()
	send := func(ev api.Event) {
		if clientGone {
			return
		}
		if err := emit(ev); err != nil {
			clientGone = true
			interrupt(fmt.Errorf("sending output: %w", err))
		}
	}
	for !idle || !replied {
		select {
		case m := <-in.msgs:
			if m.Parent.MsgID != id {
				continue // from an earlier request
			}
			reply := replyContent(m)
			if reply != nil {
				replied = true
			}
			if m.Oversize {
				if ev := salvageStream(m); ev != nil {
					send(*ev)
				}
				send(api.Event{Type: api.EventStderr, Data: fmt.Appendf(nil,
					"\n[kiln: a %s message of the kernel exceeded %d MiB; the rest of it was dropped]\n", m.Header.MsgType, maxMessage>>20)})
				continue
			}
			ev, c, isIdle := translate(m)
			if reply != nil && replyErr == nil {
				replyErr = replyError(reply)
			}
			if ev != nil {
				sawError = sawError || ev.Type == api.EventExecutionError
				send(*ev)
			}
			count = max(count, c)
			idle = idle || isIdle
		case <-in.proc.Done():
			in.drain(id, send)
			return 0, in.died()
		case <-done:
			interrupt(ctx.Err())
		case <-resend:
			_ = in.proc.Signal(syscall.SIGINT)
		case <-giveUp:
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), startTimeout)
			defer cancel()
			if err := k.Restart(rctx); err != nil {
				return 0, fmt.Errorf("restarting the %s kernel after it ignored an interrupt: %w", in.language, err)
			}
			return 0, fmt.Errorf("the %s kernel ignored the interrupt for %s and was restarted (its state is lost): %w",
				in.language, interruptGrace, stopErr)
		}
	}
	// iopub's idle comes after its error message, so by now any error
	// message has arrived; ipykernel sometimes reports an error (an
	// interrupt outside the cell's own handling) only in its reply.
	if replyErr != nil && !sawError {
		send(*replyErr)
	}
	return count, stopErr
}

// replyContent is the content of m if it is an execute_reply, or of the
// reply that a status idle carries; nil otherwise.
func replyContent(m message) json.RawMessage {
	switch m.Header.MsgType {
	case "execute_reply":
		return m.Content
	case "status":
		var c statusContent
		if json.Unmarshal(m.Content, &c) == nil && c.State == "idle" && len(c.Reply) > 0 {
			return c.Reply
		}
	}
	return nil
}

// replyError is the error of an execute_reply whose status is error, for
// the cases where ipykernel sends no error message (an interrupt that
// lands outside the cell's own exception handling, for one).
func replyError(content json.RawMessage) *api.Event {
	var c executeReply
	if json.Unmarshal(content, &c) != nil || c.Status != "error" {
		return nil
	}
	return &api.Event{Type: api.EventExecutionError, ExecutionError: &api.ExecutionError{
		Name: c.EName, Value: c.EValue, Traceback: stripANSI(strings.Join(c.Traceback, "\n"))}}
}

// salvageStream recovers the text that survived of a cut stream message:
// ipykernel encodes its content as {"name": "stdout", "text": "..."}, so
// the cut content is a prefix of that JSON string.
func salvageStream(m message) *api.Event {
	if m.Header.MsgType != "stream" {
		return nil
	}
	c := m.Content
	i := bytes.Index(c, []byte(`"text": "`))
	if i < 0 {
		return nil
	}
	typ := api.EventStdout
	if bytes.Contains(c[:i], []byte(`"stderr"`)) {
		typ = api.EventStderr
	}
	rest := c[i+len(`"text": "`):]
	// Drop a partial escape sequence at the cut (at most `\uXXX`), or
	// the closing `"}` if the cut came after the text.
	for cut := 0; cut <= 6 && cut <= len(rest); cut++ {
		var text string
		if json.Unmarshal(append(append([]byte{'"'}, rest[:len(rest)-cut]...), '"'), &text) == nil {
			return &api.Event{Type: typ, Data: []byte(text)}
		}
	}
	return nil
}

// drain emits what the kernel published before it died.
func (in *instance) drain(id string, send func(api.Event)) {
	deadline := time.After(50 * time.Millisecond)
	for {
		select {
		case m := <-in.msgs:
			if m.Parent.MsgID == id && !m.Oversize {
				if ev, _, _ := translate(m); ev != nil {
					send(*ev)
				}
			}
		case <-deadline:
			return
		}
	}
}

// died describes the kernel's death.
func (in *instance) died() error {
	msg := fmt.Sprintf("the %s kernel ended (%s) while executing; its state is lost and the next execution starts a fresh interpreter",
		in.language, in.proc.Exit())
	if tail := strings.TrimSpace(in.proc.Tail()); tail != "" {
		msg += "; it printed: " + tail
	}
	return fmt.Errorf("%w: %s", kernel.ErrDied, msg)
}

// translate turns one message of an execution into an event, its
// execution count, and whether it says the kernel is idle.
func translate(m message) (ev *api.Event, count int, idle bool) {
	switch m.Header.MsgType {
	case "stream":
		var c streamContent
		if json.Unmarshal(m.Content, &c) != nil {
			return nil, 0, false
		}
		typ := api.EventStdout
		if c.Name == "stderr" {
			typ = api.EventStderr
		}
		return &api.Event{Type: typ, Data: []byte(c.Text)}, 0, false
	case "display_data", "execute_result":
		var c displayContent
		if json.Unmarshal(m.Content, &c) != nil || len(c.Data) == 0 {
			return nil, 0, false
		}
		r := &api.Result{Data: mimeBundle(c.Data), IsMainResult: m.Header.MsgType == "execute_result"}
		return &api.Event{Type: api.EventResult, Result: r}, 0, false
	case "error":
		var c errorContent
		if json.Unmarshal(m.Content, &c) != nil {
			return nil, 0, false
		}
		return &api.Event{Type: api.EventExecutionError, ExecutionError: &api.ExecutionError{
			Name: c.EName, Value: c.EValue, Traceback: stripANSI(strings.Join(c.Traceback, "\n"))}}, 0, false
	case "execute_reply":
		var c executeReply
		_ = json.Unmarshal(m.Content, &c)
		return nil, c.ExecutionCount, false
	case "status":
		var c statusContent
		_ = json.Unmarshal(m.Content, &c)
		var r executeReply
		if len(c.Reply) > 0 {
			_ = json.Unmarshal(c.Reply, &r)
		}
		return nil, r.ExecutionCount, c.State == "idle"
	}
	return nil, 0, false
}

// mimeBundle flattens a MIME bundle into strings: JSON values (e.g.
// application/json) are re-encoded, lists of lines joined.
func mimeBundle(data map[string]json.RawMessage) map[string]string {
	out := make(map[string]string, len(data))
	for typ, raw := range data {
		var s string
		if json.Unmarshal(raw, &s) == nil {
			out[typ] = s
			continue
		}
		var lines []string
		if !strings.HasSuffix(typ, "json") && json.Unmarshal(raw, &lines) == nil {
			out[typ] = strings.Join(lines, "")
			continue
		}
		out[typ] = string(raw)
	}
	return out
}

var ansi = regexp.MustCompile(`\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]`)

func stripANSI(s string) string { return ansi.ReplaceAllString(s, "") }

// silent runs code without output or history (for the per-execution
// environment) and waits for its reply.
func (in *instance) silent(ctx context.Context, code string) error {
	ctx, cancel := context.WithTimeout(ctx, silentTimeout)
	defer cancel()
	id, err := in.send(in.shell, "execute_request", executeRequest{Code: code, Silent: true,
		UserExpressions: map[string]any{}})
	if err != nil {
		return err
	}
	for {
		select {
		case m := <-in.msgs:
			if m.Parent.MsgID != id || m.Header.MsgType != "execute_reply" {
				continue
			}
			var r executeReply
			_ = json.Unmarshal(m.Content, &r)
			if r.Status != "ok" {
				return fmt.Errorf("%s: %s", r.EName, r.EValue)
			}
			return nil
		case <-in.proc.Done():
			return in.died()
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// sortedKeys returns m's keys in order, so generated code is stable.
func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
