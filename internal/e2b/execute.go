package e2b

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/channel"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

const (
	// keepaliveEvery is the silence after which /execute sends a
	// keepalive line, so that a vanished client is noticed.
	keepaliveEvery = 5 * time.Second
	// maxExecuteBody bounds the body of POST /execute.
	maxExecuteBody = 8 << 20
	// timestampLayout is the Python isoformat E2B's lines carry.
	timestampLayout = "2006-01-02T15:04:05.000000Z07:00"
)

// executionRequest is the body of POST /execute.
type executionRequest struct {
	Code      *string           `json:"code"`
	ContextID string            `json:"context_id"`
	Language  string            `json:"language"`
	EnvVars   map[string]string `json:"env_vars"`
}

// Stream lines (e2b-protocol.md §4.2), fields in E2B's order.
type (
	typeLine struct {
		Type string `json:"type"`
	}
	outputLine struct {
		Type      string `json:"type"`
		Text      string `json:"text"`
		Timestamp string `json:"timestamp"`
	}
	errorLine struct {
		Type      string `json:"type"`
		Name      string `json:"name"`
		Value     string `json:"value"`
		Traceback string `json:"traceback"`
	}
	countLine struct {
		Type           string `json:"type"`
		ExecutionCount int    `json:"execution_count"`
	}
)

// execute runs code and streams E2B's JSON lines: output, results and
// errors as they come, then number_of_executions and end_of_execution.
// The response begins with the first line, so that a missing context is
// still a 404; when the client goes away the execution is interrupted.
func (h *Handler) execute(w http.ResponseWriter, r *http.Request) {
	t := targetOf(r)
	if got := r.Header.Get("X-Access-Token"); subtle.ConstantTimeCompare([]byte(got), []byte(t.token)) != 1 {
		http.Error(w, "unauthorized access, please provide a valid access token", http.StatusUnauthorized)
		return
	}
	var req executionRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxExecuteBody))
	if err := dec.Decode(&req); err != nil || req.Code == nil {
		http.Error(w, "invalid request: want a JSON object with code", http.StatusBadRequest)
		return
	}
	if req.ContextID != "" && req.Language != "" {
		http.Error(w, "Only one of context_id or language can be provided", http.StatusBadRequest)
		return
	}
	if err := sandbox.CheckEnv(req.EnvVars); err != nil {
		// The native API's checks: the agent would fail these as internal.
		msg := strings.TrimSuffix(err.Error(), ": "+errdefs.ErrInvalidArgument.Error())
		http.Error(w, "env_vars"+strings.TrimPrefix(msg, "env"), http.StatusBadRequest)
		return
	}
	p := wire.ExecuteParams{Code: *req.Code, ContextID: req.ContextID, Env: req.EnvVars}
	if req.ContextID == "" {
		p.Language = language(req.Language)
	} else if !contextIDRE.MatchString(req.ContextID) {
		http.Error(w, fmt.Sprintf("Context %s not found", errdefs.ClipN(req.ContextID, 40)), http.StatusNotFound)
		return
	}
	if strings.TrimSpace(p.Code) == "" {
		// The agent wants code; an empty cell runs nothing.
		p.Code = "\n"
	}
	st := newLineStream(w)
	defer st.stop()
	count, err := t.a.Execute(r.Context(), p, st.event)
	switch {
	case err == nil:
		if count > 0 {
			st.line(countLine{Type: "number_of_executions", ExecutionCount: count})
		}
	case r.Context().Err() != nil:
		return // the client went away; the agent interrupted the code
	case errors.Is(err, channel.ErrSessionClosed):
		// The sandbox was killed or paused meanwhile: tear the connection
		// down as E2B's proxy does; the SDK then finds it not running.
		panic(http.ErrAbortHandler)
	case st.claim():
		if errors.Is(err, errdefs.ErrNotFound) && req.ContextID != "" {
			http.Error(w, fmt.Sprintf("Context %s not found", errdefs.Clip(req.ContextID)), http.StatusNotFound)
			return
		}
		h.textError(w, r, fmt.Errorf("executing code: %w", err))
		return
	default:
		h.log.Info("execution ended early", "sandbox_id", t.sb.ID, "err", err)
		_, msg := h.problem(r, err)
		st.line(errorLine{Type: "error", Name: "UnexpectedEndOfExecution", Value: msg, Traceback: ""})
	}
	st.line(typeLine{Type: "end_of_execution"})
}

// lineStream writes JSON lines to a response, begun lazily by the first
// line, with a keepalive line after every keepaliveEvery of silence.
type lineStream struct {
	w  http.ResponseWriter
	rc *http.ResponseController

	mu      sync.Mutex
	started bool
	stopped bool // no more lines: the handler is done with the response
	last    time.Time
	failed  error

	done   chan struct{} // closed by stop
	exited chan struct{} // closed when the keepalive goroutine ends
}

// errStopped is line's error once the stream is stopped.
var errStopped = errors.New("the response is finished")

func newLineStream(w http.ResponseWriter) *lineStream {
	s := &lineStream{w: w, rc: http.NewResponseController(w), last: time.Now(),
		done: make(chan struct{}), exited: make(chan struct{})}
	go s.keepalive()
	return s
}

func (s *lineStream) keepalive() {
	defer close(s.exited)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-s.done:
			return
		case now := <-tick.C:
			s.mu.Lock()
			quiet := now.Sub(s.last) >= keepaliveEvery
			s.mu.Unlock()
			if quiet {
				_ = s.line(typeLine{Type: "keepalive"})
			}
		}
	}
}

// stop ends the stream and waits for its keepalive goroutine, so that
// nothing writes to the response after the handler returns.
func (s *lineStream) stop() {
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
	close(s.done)
	<-s.exited
}

// claim stops the stream if it has not begun, handing the response to
// the caller for a plain answer; it reports whether it did.
func (s *lineStream) claim() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		return false
	}
	s.stopped = true
	return true
}

// line writes one JSON line and flushes it.
func (s *lineStream) line(v any) error {
	b, err := marshal(v)
	if err != nil {
		return fmt.Errorf("encoding line: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return errStopped
	}
	if s.failed != nil {
		return s.failed
	}
	if !s.started {
		s.started = true
		s.w.Header().Set("Content-Type", "application/x-ndjson")
		s.w.Header().Set("Cache-Control", "no-cache")
		s.w.WriteHeader(http.StatusOK)
	}
	s.last = time.Now()
	if _, err := s.w.Write(append(b, '\n')); err != nil {
		s.failed = fmt.Errorf("writing to the client: %w", err)
		return s.failed
	}
	if err := s.rc.Flush(); err != nil {
		s.failed = fmt.Errorf("flushing to the client: %w", err)
	}
	return s.failed
}

// event translates one of the agent's execution events into a line.
func (s *lineStream) event(ev api.Event) error {
	switch ev.Type {
	case api.EventStdout, api.EventStderr:
		return s.line(outputLine{Type: string(ev.Type), Text: string(ev.Data), Timestamp: timestamp(ev.Time)})
	case api.EventResult:
		if ev.Result == nil {
			return nil
		}
		return s.line(resultLine(*ev.Result))
	case api.EventExecutionError:
		if e := ev.ExecutionError; e != nil {
			return s.line(errorLine{Type: "error", Name: e.Name, Value: e.Value, Traceback: e.Traceback})
		}
	}
	return nil
}

func timestamp(t time.Time) string {
	if t.IsZero() {
		t = time.Now()
	}
	return t.UTC().Format(timestampLayout)
}
