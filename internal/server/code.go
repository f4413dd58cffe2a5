package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

const (
	// maxCodeBytes bounds the code of one execution.
	maxCodeBytes = 1 << 20
	// maxCodeBody bounds the body of POST .../code: the code, escaped in
	// JSON, plus its env.
	maxCodeBody = 8 << 20
	// defaultLanguage is used when a request names none.
	defaultLanguage = "python"
	// contextCallTimeout bounds the context calls, which may start or
	// restart an interpreter (R or Java can take seconds in gVisor).
	contextCallTimeout = 2 * time.Minute
	// codeGrace is how long past its timeout an execution may run before
	// the server gives up on the agent interrupting it.
	codeGrace = time.Minute
)

// languageRE accepts language names such as "python", "r", "js", "c++",
// "c#"; which ones exist is the agent's business.
var languageRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+#._-]{0,31}$`)

// contextIDRE accepts context ids, which the agent makes.
var contextIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// runCode runs code in a context: an NDJSON stream of events (stdout,
// stderr, result, execution_error, done), or with Accept: application/json
// the aggregated api.CodeResult.
func (s *Server) runCode(w http.ResponseWriter, r *http.Request) error {
	if isWebSocket(r) {
		return fmt.Errorf("WebSocket streams need GET; POST .../code streams NDJSON: %w", errdefs.ErrInvalidArgument)
	}
	var req api.CodeRequest
	if err := decodeBody(http.MaxBytesReader(w, r.Body, maxCodeBody), &req); err != nil {
		return err
	}
	p, err := s.executeParams(req)
	if err != nil {
		return err
	}
	a, err := s.agent(r)
	if err != nil {
		return err
	}
	if wantsJSON(r) {
		return s.runCodeAggregated(w, r, a, p)
	}
	st := s.newStream(w, r)
	ctx, cancel := context.WithTimeout(st.ctx, time.Duration(p.TimeoutMs)*time.Millisecond+codeGrace)
	defer cancel()
	_, err = a.Execute(ctx, p, st.send)
	return st.finish(codeError(ctx, err))
}

// executeParams validates a code request and applies the defaults.
func (s *Server) executeParams(req api.CodeRequest) (wire.ExecuteParams, error) {
	p := wire.ExecuteParams{Code: req.Code, ContextID: req.ContextID, Env: req.Env}
	switch {
	case strings.TrimSpace(req.Code) == "":
		return p, invalid("code is required")
	case len(req.Code) > maxCodeBytes:
		return p, invalid("code of %d bytes: at most %d", len(req.Code), maxCodeBytes)
	case strings.ContainsRune(req.Code, 0):
		return p, invalid("code contains a NUL byte")
	}
	if req.ContextID != "" {
		if err := checkContextID(req.ContextID); err != nil {
			return p, err
		}
	} else {
		var err error
		if p.Language, err = checkLanguage(req.Language); err != nil {
			return p, err
		}
	}
	if err := sandbox.CheckEnv(req.Env); err != nil {
		return p, err
	}
	l := s.cfg.Limits
	switch max := l.MaxCommandTimeout.Seconds(); {
	case req.Timeout < 0 || req.Timeout > max || req.Timeout != req.Timeout:
		return p, invalid("timeout %v: want seconds in (0, %v], or 0 for the default (%v)", req.Timeout, max, l.DefaultCommandTimeout.Seconds())
	case req.Timeout == 0:
		p.TimeoutMs = l.DefaultCommandTimeout.Milliseconds()
	default:
		p.TimeoutMs = max64(1, int64(req.Timeout*1000))
	}
	return p, nil
}

func checkLanguage(l string) (string, error) {
	if l == "" {
		return defaultLanguage, nil
	}
	if !languageRE.MatchString(l) {
		return "", invalid("language %q: want a name such as python, r, javascript, typescript, bash, go, rust, c, cpp or java", errdefs.ClipN(l, 32))
	}
	return l, nil
}

func checkContextID(id string) error {
	if !contextIDRE.MatchString(id) {
		return invalid("context id %q: want up to 128 letters, digits, '.', '_' or '-'", errdefs.ClipN(id, 40))
	}
	return nil
}

// codeError explains an execution the server gave up on: ctx, its
// deadline of timeout plus codeGrace, ended before the agent did.
func codeError(ctx context.Context, err error) error {
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("execution did not end within its timeout plus %v: %w", codeGrace, errdefs.ErrDeadlineExceeded)
	}
	return err
}

// runCodeAggregated runs code to its end and answers everything it
// produced at once.
func (s *Server) runCodeAggregated(w http.ResponseWriter, r *http.Request, a *sandbox.Agent, p wire.ExecuteParams) error {
	ctx, cancel := context.WithTimeout(r.Context(), time.Duration(p.TimeoutMs)*time.Millisecond+codeGrace)
	defer cancel()
	res := api.CodeResult{Results: []api.Result{}}
	var stdout, stderr strings.Builder
	size := 0
	count, err := a.Execute(ctx, p, func(ev api.Event) error {
		switch ev.Type {
		case api.EventStdout:
			stdout.Write(ev.Data)
			size += len(ev.Data)
		case api.EventStderr:
			stderr.Write(ev.Data)
			size += len(ev.Data)
		case api.EventResult:
			if ev.Result != nil {
				res.Results = append(res.Results, *ev.Result)
				for _, v := range ev.Result.Data {
					size += len(v)
				}
			}
		case api.EventExecutionError:
			res.Error = ev.ExecutionError
		}
		if size > maxAggregatedOutput {
			return fmt.Errorf("output larger than %d bytes with Accept: application/json; use the stream: %w", maxAggregatedOutput, errdefs.ErrResourceExhausted)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("running code: %w", codeError(ctx, err))
	}
	res.Stdout, res.Stderr, res.ExecutionCount = stdout.String(), stderr.String(), count
	return writeJSON(w, http.StatusOK, res)
}

func (s *Server) createContext(w http.ResponseWriter, r *http.Request) error {
	var req api.CreateContextRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	p := wire.ContextParams{Cwd: req.Cwd, Env: req.Env, User: wire.UserDefault}
	var err error
	if p.Language, err = checkLanguage(req.Language); err != nil {
		return err
	}
	if req.Cwd != "" {
		if err := checkPath("cwd", req.Cwd); err != nil {
			return err
		}
	}
	if err := sandbox.CheckEnv(req.Env); err != nil {
		return err
	}
	a, err := s.agent(r)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(r.Context(), contextCallTimeout)
	defer cancel()
	c, err := a.CreateContext(ctx, p)
	if err != nil {
		return fmt.Errorf("creating %s context: %w", p.Language, err)
	}
	return writeJSON(w, http.StatusCreated, c)
}

func (s *Server) listContexts(w http.ResponseWriter, r *http.Request) error {
	return listFromAgent(s, w, r, "contexts", (*sandbox.Agent).Contexts)
}

func (s *Server) restartContext(w http.ResponseWriter, r *http.Request) error {
	return s.contextCall(r, func(ctx context.Context, a *sandbox.Agent, id string) error {
		c, err := a.RestartContext(ctx, id)
		if err != nil {
			return fmt.Errorf("restarting context %s: %w", id, err)
		}
		return writeJSON(w, http.StatusOK, c)
	})
}

func (s *Server) deleteContext(w http.ResponseWriter, r *http.Request) error {
	return s.contextCall(r, func(ctx context.Context, a *sandbox.Agent, id string) error {
		if err := a.DeleteContext(ctx, id); err != nil {
			return fmt.Errorf("deleting context %s: %w", id, err)
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	})
}

// contextCall runs call on the context {ctx} of the caller's sandbox {id}.
func (s *Server) contextCall(r *http.Request, call func(context.Context, *sandbox.Agent, string) error) error {
	id := r.PathValue("ctx")
	if err := checkContextID(id); err != nil {
		return err
	}
	a, err := s.agent(r)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(r.Context(), contextCallTimeout)
	defer cancel()
	return call(ctx, a, id)
}
