package kernel

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kiln-sh/kiln/api"
)

// DefaultOutputLimit caps the output bytes (stdout, stderr and results)
// forwarded per execution; beyond it output is dropped after one marker.
const DefaultOutputLimit = 16 << 20

// Languages are the canonical language names, in the order error
// messages list them.
var Languages = []string{"python", "r", "javascript", "typescript", "bash", "go", "rust", "c", "cpp", "java"}

var aliases = map[string]string{
	"py": "python", "python3": "python",
	"js": "javascript", "node": "javascript", "ts": "typescript",
	"sh": "bash", "shell": "bash",
	"c++": "cpp",
}

// Canonical returns the canonical name of a language or alias (case
// insensitive); an unknown one is an invalid_argument error listing the
// supported languages.
func Canonical(language string) (string, error) {
	l := strings.ToLower(strings.TrimSpace(language))
	if a, ok := aliases[l]; ok {
		l = a
	}
	if !slices.Contains(Languages, l) {
		return "", &api.Error{Code: api.CodeInvalidArgument, Message: fmt.Sprintf(
			"unsupported language %q: want one of %s", language, strings.Join(Languages, ", "))}
	}
	return l, nil
}

// Config configures a Contexts registry.
type Config struct {
	Log *slog.Logger
	// Factories start a kernel per canonical language; a language without
	// one is reported as unavailable.
	Factories map[string]Factory
	// Spawn starts interpreter processes (see Spawner); nil: wait4(pid).
	Spawn Spawner
	// OutputLimit caps output per execution; 0: DefaultOutputLimit.
	OutputLimit int64
	// Memory admits kernels against the sandbox's memory (see Memory);
	// zero: every kernel starts.
	Memory Memory
}

// Contexts is the registry of a sandbox's code contexts: each has its own
// kernel, executions in one context run one at a time in arrival order,
// and different contexts run in parallel.
type Contexts struct {
	cfg Config
	log *slog.Logger

	mu       sync.Mutex
	byID     map[string]*entry
	defaults map[string]*entry // canonical language → its default context
	closed   bool

	amu      sync.Mutex // serialises admissions (see admit)
	starting int64      // bytes reserved for kernels being started
	freed    time.Time  // when a context was last deleted (see admit)
}

// entry is one context.
type entry struct {
	info    api.Context
	opts    Options
	factory Factory
	turn    chan struct{} // 1-buffered: held by the running call; waiters queue in order

	mu      sync.Mutex
	k       Kernel // nil until started (default contexts start lazily)
	dead    bool   // the interpreter died; restart before the next execution
	gen     int    // restarts so far, to tell a restart from a crash
	deleted bool
}

// NewContexts returns an empty registry.
func NewContexts(cfg Config) *Contexts {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	cfg.OutputLimit = cmp.Or(cfg.OutputLimit, DefaultOutputLimit)
	return &Contexts{cfg: cfg, log: cfg.Log, byID: make(map[string]*entry), defaults: make(map[string]*entry)}
}

// Create starts a context's kernel and registers it under a random id.
func (c *Contexts) Create(ctx context.Context, language string, o Options) (api.Context, error) {
	e, err := c.newEntry(language, o)
	if err != nil {
		return api.Context{}, err
	}
	k, release, err := c.start(ctx, e)
	if err != nil {
		return api.Context{}, err
	}
	defer release()
	e.k = k
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		_ = k.Close()
		return api.Context{}, errShutdown
	}
	c.byID[e.info.ID] = e
	c.log.Info("context created", "id", e.info.ID, "language", e.info.Language)
	return e.info, nil
}

// Made returns the language's default context if it has been registered,
// so that a caller can skip preparing the options only a new one needs.
func (c *Contexts) Made(language string) (api.Context, bool) {
	l, err := Canonical(language)
	if err != nil {
		return api.Context{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.defaults[l]; e != nil {
		return e.info, true
	}
	return api.Context{}, false
}

// Default returns the language's default context, registering it on
// first use; its kernel starts with its first execution.
func (c *Contexts) Default(language string, o Options) (api.Context, error) {
	l, err := Canonical(language)
	if err != nil {
		return api.Context{}, err
	}
	c.mu.Lock()
	if e := c.defaults[l]; e != nil {
		c.mu.Unlock()
		return e.info, nil
	}
	c.mu.Unlock()
	e, err := c.newEntry(l, o)
	if err != nil {
		return api.Context{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return api.Context{}, errShutdown
	}
	if d := c.defaults[l]; d != nil { // created meanwhile
		return d.info, nil
	}
	c.defaults[l] = e
	c.byID[e.info.ID] = e
	return e.info, nil
}

func (c *Contexts) newEntry(language string, o Options) (*entry, error) {
	l, err := Canonical(language)
	if err != nil {
		return nil, err
	}
	f := c.cfg.Factories[l]
	if f == nil {
		return nil, &api.Error{Code: api.CodeUnavailable, Message: "no kernel for " + l + " in this agent"}
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	return &entry{
		info:    api.Context{ID: hex.EncodeToString(b[:]), Language: l, Cwd: o.Cwd, CreatedAt: time.Now().UTC()},
		opts:    o,
		factory: f,
		turn:    make(chan struct{}, 1),
	}, nil
}

// start admits and starts e's kernel; the caller calls release once the
// kernel is where admission counts it (e.k), or is given up.
func (c *Contexts) start(ctx context.Context, e *entry) (_ Kernel, release func(), _ error) {
	release, err := c.admit(ctx, e.info.Language)
	if err != nil {
		return nil, nil, err
	}
	started := time.Now()
	k, err := e.factory(WithSpawner(ctx, c.cfg.Spawn), e.opts)
	if err != nil {
		release()
		return nil, nil, c.startError(e, err)
	}
	c.log.Debug("kernel started", "id", e.info.ID, "language", e.info.Language, "took", time.Since(started))
	return k, release, nil
}

// startError classifies why a kernel did not start: the caller's fault
// (a working directory the user may not enter, a missing interpreter) or
// the sandbox's.
func (c *Contexts) startError(e *entry, err error) error {
	var ae *api.Error
	if errors.As(err, &ae) {
		return err
	}
	msg := "starting the " + e.info.Language + " kernel: " + err.Error()
	switch {
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
		return &api.Error{Code: api.CodePermissionDenied, Message: msg}
	case errors.Is(err, syscall.ENOENT), errors.Is(err, syscall.ENOTDIR):
		return &api.Error{Code: api.CodeNotFound, Message: msg}
	case errors.Is(err, syscall.EAGAIN), errors.Is(err, syscall.ENOMEM):
		return &api.Error{Code: api.CodeResourceExhausted, Message: msg}
	}
	c.log.Warn("starting kernel", "language", e.info.Language, "err", err)
	return &api.Error{Code: api.CodeUnavailable, Message: msg}
}

var errShutdown = &api.Error{Code: api.CodeUnavailable, Message: "the agent is shutting down"}

func (c *Contexts) get(id string) (*entry, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errShutdown
	}
	e := c.byID[id]
	if e == nil {
		return nil, &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("no context %q", id)}
	}
	return e, nil
}

// List returns the contexts, oldest first.
func (c *Contexts) List() []api.Context {
	c.mu.Lock()
	out := make([]api.Context, 0, len(c.byID))
	for _, e := range c.byID {
		out = append(out, e.info)
	}
	c.mu.Unlock()
	slices.SortFunc(out, func(a, b api.Context) int {
		return cmp.Or(a.CreatedAt.Compare(b.CreatedAt), strings.Compare(a.ID, b.ID))
	})
	return out
}

// Restart replaces a context's interpreter with a fresh one, at once:
// a running execution ends with an execution error saying so.
func (c *Contexts) Restart(ctx context.Context, id string) (api.Context, error) {
	e, err := c.get(id)
	if err != nil {
		return api.Context{}, err
	}
	e.mu.Lock()
	k := e.k
	e.gen++
	e.dead = false
	e.mu.Unlock()
	if k == nil {
		return e.info, nil // not started yet: nothing to lose
	}
	if err := k.Restart(ctx); err != nil {
		e.mu.Lock()
		e.dead = true // try again before the next execution
		e.mu.Unlock()
		return api.Context{}, &api.Error{Code: api.CodeUnavailable, Message: "restarting the " + e.info.Language + " kernel: " + err.Error()}
	}
	return e.info, nil
}

// Delete stops a context's kernel and forgets the context.
func (c *Contexts) Delete(id string) error {
	c.mu.Lock()
	e := c.byID[id]
	if e == nil {
		c.mu.Unlock()
		return &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("no context %q", id)}
	}
	delete(c.byID, id)
	if c.defaults[e.info.Language] == e {
		delete(c.defaults, e.info.Language)
	}
	c.mu.Unlock()
	e.close()
	c.amu.Lock()
	c.freed = time.Now()
	c.amu.Unlock()
	return nil
}

func (e *entry) close() {
	e.mu.Lock()
	k := e.k
	e.k, e.deleted = nil, true
	e.mu.Unlock()
	if k != nil {
		_ = k.Close()
	}
}

// Close stops every kernel; the registry refuses further calls.
func (c *Contexts) Close() error {
	c.mu.Lock()
	c.closed = true
	es := make([]*entry, 0, len(c.byID))
	for _, e := range c.byID {
		es = append(es, e)
	}
	c.byID, c.defaults = map[string]*entry{}, map[string]*entry{}
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, e := range es {
		wg.Go(e.close)
	}
	wg.Wait()
	return nil
}

// Execute runs code in a context after the executions queued before it,
// emitting its events; it returns the execution count. With a timeout
// the code is interrupted when it passes (a deadline_exceeded error) and
// the context keeps its state. A kernel that dies is reported as an
// execution error (name "KernelDied") and restarted before the next
// execution.
func (c *Contexts) Execute(ctx context.Context, id, code string, env map[string]string, timeout time.Duration,
	emit func(api.Event) error) (int, error) {
	e, err := c.take(ctx, id)
	if err != nil {
		return 0, err
	}
	defer func() { <-e.turn }()
	return c.execute(ctx, e, code, env, timeout, emit)
}

// Queue runs code in a context after the executions queued before it and
// before any queued after Queue returns, without waiting for it: it takes
// the context's turn now and runs code in the background, then calls done
// with its error (an exception in the code is one). Its output is
// discarded, and it is hidden (see WithHidden): code the host queues for
// itself is not one of the user's executions.
func (c *Contexts) Queue(ctx context.Context, id, code string, timeout time.Duration, done func(error)) error {
	e, err := c.take(ctx, id)
	if err != nil {
		return err
	}
	go func() {
		defer func() { <-e.turn }()
		var failed *api.ExecutionError
		_, err := c.execute(WithHidden(context.Background()), e, code, nil, timeout, func(ev api.Event) error {
			if ev.ExecutionError != nil {
				failed = ev.ExecutionError
			}
			return nil
		})
		if err == nil && failed != nil {
			err = fmt.Errorf("%s: %s", failed.Name, failed.Value)
		}
		done(err)
	}()
	return nil
}

// take waits for context id's turn and returns the context; the caller
// gives the turn back with <-e.turn.
func (c *Contexts) take(ctx context.Context, id string) (*entry, error) {
	e, err := c.get(id)
	if err != nil {
		return nil, err
	}
	select {
	case e.turn <- struct{}{}:
		return e, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// execute is Execute for a caller that has the context's turn.
func (c *Contexts) execute(ctx context.Context, e *entry, code string, env map[string]string, timeout time.Duration,
	emit func(api.Event) error) (int, error) {
	k, gen, err := c.ready(ctx, e)
	if err != nil {
		return 0, err
	}
	ectx := ctx
	if timeout > 0 {
		var cancel context.CancelFunc
		ectx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	out := &capped{limit: c.cfg.OutputLimit, emit: emit}
	count, err := k.Execute(ectx, code, env, out.send)
	switch {
	case err == nil:
		return count, nil
	case errors.Is(err, ErrDied):
		e.mu.Lock()
		restarted := e.gen != gen
		e.dead = e.dead || !restarted
		e.mu.Unlock()
		value := err.Error()
		if restarted {
			value = "the context was restarted during this execution; its state is lost"
		}
		c.log.Info("kernel died", "id", e.info.ID, "language", e.info.Language, "restarted", restarted)
		return 0, emit(api.Event{Type: api.EventExecutionError, ExecutionError: &api.ExecutionError{
			Name: "KernelDied", Value: value}})
	case ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded):
		return count, &api.Error{Code: api.CodeDeadlineExceeded, Message: fmt.Sprintf(
			"the execution was interrupted after its timeout of %s: %v", timeout, err)}
	case ctx.Err() != nil:
		return count, ctx.Err()
	}
	var ae *api.Error
	if errors.As(err, &ae) {
		return count, err
	}
	return count, fmt.Errorf("executing %s code: %w", e.info.Language, err)
}

// ready returns the context's kernel, starting or restarting it first as
// needed, and the restart generation it belongs to. A start or restart
// runs to its end (the kernel's own start timeout) even if the caller
// gives up: on a loaded host a client's timeout may fall inside a slow
// kernel start, and its retry should find the kernel up, not start it
// over and give up at the same point again.
func (c *Contexts) ready(ctx context.Context, e *entry) (Kernel, int, error) {
	startCtx := context.WithoutCancel(ctx)
	e.mu.Lock()
	k, dead, deleted, gen := e.k, e.dead, e.deleted, e.gen
	e.mu.Unlock()
	switch {
	case deleted:
		return nil, 0, &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("context %q was deleted", e.info.ID)}
	case k == nil:
		nk, release, err := c.start(startCtx, e)
		if err != nil {
			return nil, 0, err
		}
		defer release()
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.deleted {
			_ = nk.Close()
			return nil, 0, &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("context %q was deleted", e.info.ID)}
		}
		e.k = nk
		return nk, e.gen, nil
	case dead:
		if err := k.Restart(startCtx); err != nil {
			return nil, 0, &api.Error{Code: api.CodeUnavailable, Message: "restarting the " + e.info.Language + " kernel: " + err.Error()}
		}
		e.mu.Lock()
		e.dead = false
		gen = e.gen
		e.mu.Unlock()
	}
	return k, gen, nil
}

// capped forwards an execution's events until its output passes the
// limit, then one marker and nothing more but execution errors.
type capped struct {
	limit, used int64
	truncated   bool
	emit        func(api.Event) error
}

func (c *capped) send(ev api.Event) error {
	if ev.Type == api.EventExecutionError || ev.Type == api.EventDone {
		return c.emit(ev)
	}
	if c.truncated {
		return nil
	}
	n := int64(len(ev.Data))
	if ev.Result != nil {
		for k, v := range ev.Result.Data {
			n += int64(len(k) + len(v))
		}
	}
	if c.used+n <= c.limit {
		c.used += n
		return c.emit(ev)
	}
	c.truncated = true
	if (ev.Type == api.EventStdout || ev.Type == api.EventStderr) && c.used < c.limit {
		part := ev
		part.Data = ev.Data[:c.limit-c.used]
		if err := c.emit(part); err != nil {
			return err
		}
	}
	return c.emit(api.Event{Type: api.EventStderr, Data: fmt.Appendf(nil,
		"\n[kiln: output exceeded %d MiB; the rest of this execution's output was dropped]\n", c.limit>>20)})
}
