// Package repl runs persistent interpreters the agent drives itself over
// pipes: JavaScript/TypeScript on node (NewNode, NewTypeScript) and bash
// (NewBash). Each cell's end is found with sync markers (see marker.go);
// an interpreter's death by EOF on a control pipe only it holds.
package repl

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agent/kernel"
)

var (
	_ kernel.Kernel = (*replKernel)(nil)
	_ kernel.PIDer  = (*replKernel)(nil)
)

// startTimeout bounds an interpreter's start-up handshake.
const startTimeout = 30 * time.Second

// replKernel is a kernel.Kernel over one interpreter process at a time;
// the language-specific parts are its function fields.
type replKernel struct {
	lang     string
	opts     kernel.Options
	needResp bool // the interpreter answers each cell on the control pipe

	start     func() (*session, error)
	initReq   func(s *session) []byte // sent at start-up; nil: the driver announces itself
	request   func(s *session, id int, code string, env map[string]string) ([]byte, error)
	result    func(r turnResult) []api.Event
	interrupt func(s *session, step int, req []byte)

	mu     sync.Mutex // serialises Execute and Restart
	smu    sync.Mutex // guards s and closed
	s      *session
	count  int // executions since the last Restart
	seq    int // turn ids, unique per kernel
	closed bool
}

func (k *replKernel) Language() string { return k.lang }

// PID returns the interpreter's pid, 0 while there is none.
func (k *replKernel) PID() int {
	if s := k.current(); s != nil {
		return s.pid
	}
	return 0
}

func (k *replKernel) Execute(ctx context.Context, code string, env map[string]string, emit func(api.Event) error) (int, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	s, err := k.session(ctx)
	if err != nil {
		return 0, err
	}
	if !kernel.IsHidden(ctx) {
		k.count++
	}
	n := k.count
	k.seq++
	id := k.seq
	req, err := k.request(s, id, code, env)
	if err != nil {
		return n, err
	}
	res := s.run(ctx, req, turn{
		id:        strconv.Itoa(id),
		needResp:  k.needResp,
		emit:      emit,
		interrupt: func(step int) { k.interrupt(s, step, req) },
	})
	if res.emitErr != nil {
		return n, fmt.Errorf("emitting event: %w", res.emitErr)
	}
	var evs []api.Event
	if res.died {
		k.drop(s)
		ee := &api.ExecutionError{Name: "KernelDied", Value: "the interpreter ended",
			Traceback: "the " + k.lang + " interpreter ended; the next execution starts a fresh one (state is lost)"}
		if code, ok := exitCode(res.extra); ok {
			ee.Name, ee.Value = "ExitError", fmt.Sprintf("exit status %d", code)
		}
		evs = append(evs, api.Event{Type: api.EventExecutionError, ExecutionError: ee})
	} else {
		evs = k.result(res)
	}
	for _, ev := range evs {
		if err := emit(ev); err != nil {
			return n, fmt.Errorf("emitting event: %w", err)
		}
	}
	if res.ctxErr != nil {
		return n, fmt.Errorf("executing cell: %w", res.ctxErr)
	}
	return n, nil
}

// session returns the live interpreter, starting one if there is none or
// the last one died.
func (k *replKernel) session(ctx context.Context) (*session, error) {
	k.smu.Lock()
	s, closed := k.s, k.closed
	k.smu.Unlock()
	if closed {
		return nil, errClosed
	}
	if s != nil && s.alive() {
		return s, nil
	}
	if s != nil {
		k.drop(s)
	}
	s, err := k.start()
	if err != nil {
		return nil, fmt.Errorf("starting %s interpreter: %w", k.lang, err)
	}
	var init []byte
	if k.initReq != nil {
		init = k.initReq(s)
	}
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	res := s.run(ctx, init, turn{id: "0", needResp: k.needResp})
	if res.died || res.ctxErr != nil {
		s.kill()
		return nil, fmt.Errorf("starting %s interpreter: %w", k.lang, errors.Join(errors.New("no handshake"), res.ctxErr))
	}
	k.smu.Lock()
	defer k.smu.Unlock()
	if k.closed {
		s.kill()
		return nil, errClosed
	}
	k.s = s
	return s, nil
}

// drop forgets s and kills it.
func (k *replKernel) drop(s *session) {
	k.smu.Lock()
	if k.s == s {
		k.s = nil
	}
	k.smu.Unlock()
	s.kill()
}

func (k *replKernel) current() *session {
	k.smu.Lock()
	defer k.smu.Unlock()
	return k.s
}

func (k *replKernel) Interrupt(ctx context.Context) error {
	if s := k.current(); s != nil && s.running() {
		k.interrupt(s, 0, nil)
	}
	return nil
}

// Restart kills the interpreter (ending a running execution) and starts a
// fresh one; the execution count starts again from 1.
func (k *replKernel) Restart(ctx context.Context) error {
	if s := k.current(); s != nil {
		k.drop(s)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.count = 0
	_, err := k.session(ctx)
	return err
}

func (k *replKernel) Close() error {
	k.smu.Lock()
	s := k.s
	k.s, k.closed = nil, true
	k.smu.Unlock()
	if s != nil {
		s.kill()
	}
	return nil
}
