package agent

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agent/kernel"
	"github.com/kiln-sh/kiln/internal/agent/kernel/jupyter"
	"github.com/kiln-sh/kiln/internal/agent/kernel/oneshot"
	"github.com/kiln-sh/kiln/internal/agent/kernel/repl"
	"github.com/kiln-sh/kiln/internal/agent/process"
	"github.com/kiln-sh/kiln/internal/agentapi/channel"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
)

// defaultLanguage is used when a call names none.
const defaultLanguage = "python"

// eventChunk bounds the data of one output event, well under the
// channel's frame limit once base64-encoded.
const eventChunk = 64 << 10

// kernelFactories names the kernel of each canonical language: Jupyter
// kernels for Python and R, the agent's own REPLs for JavaScript,
// TypeScript and Bash, and compile-and-run for the compiled languages.
func kernelFactories() map[string]kernel.Factory {
	f := map[string]kernel.Factory{
		"python":     jupyter.Python,
		"r":          jupyter.R,
		"javascript": repl.NewNode,
		"typescript": repl.NewTypeScript,
		"bash":       repl.NewBash,
	}
	for _, l := range oneshot.Languages() {
		f[l] = oneshot.New(l)
	}
	return f
}

// newContexts returns the code contexts registry; kernels are started
// through the process table so that its reaper hands them their exit
// status, and admitted against the sandbox's memory limit (see
// kernel.Memory) so that idle kernels cannot fill it.
func newContexts(s *Server) *kernel.Contexts {
	return kernel.NewContexts(kernel.Config{
		Log:         s.log.With("component", "kernel"),
		Factories:   kernelFactories(),
		Spawn:       s.procs.Spawn,
		OutputLimit: kernel.DefaultOutputLimit,
		Memory:      kernel.Memory{Limit: s.cfg.MemoryLimit, Usage: s.cfg.memoryUsage()},
	})
}

func (s *Server) contextCreate(ctx context.Context, p wire.ContextParams) (api.Context, error) {
	o, err := s.kernelOptions(p.User, p.Cwd, p.Env)
	if err != nil {
		return api.Context{}, err
	}
	return s.contexts.Create(ctx, cmp.Or(p.Language, defaultLanguage), o)
}

func (s *Server) contextRestart(ctx context.Context, p wire.ContextIDParams) (api.Context, error) {
	if p.ID == "" {
		return api.Context{}, &api.Error{Code: api.CodeInvalidArgument, Message: "no context id given"}
	}
	return s.contexts.Restart(ctx, p.ID)
}

func (s *Server) contextDelete(p wire.ContextIDParams) error {
	if p.ID == "" {
		return &api.Error{Code: api.CodeInvalidArgument, Message: "no context id given"}
	}
	return s.contexts.Delete(p.ID)
}

// execute runs code in a context (the language's default one without a
// context id) and streams its events, then done with the execution count.
func (s *Server) execute(ctx context.Context, st *channel.Stream, p wire.ExecuteParams) (any, error) {
	if p.TimeoutMs < 0 {
		return nil, &api.Error{Code: api.CodeInvalidArgument, Message: "timeout must not be negative"}
	}
	id := p.ContextID
	if id == "" {
		c, err := s.defaultContext(p.Language)
		if err != nil {
			return nil, err
		}
		id = c.ID
	}
	var seq uint64
	send := func(ev api.Event) error {
		seq++
		ev.Seq, ev.Time = seq, time.Now().UTC()
		return st.SendEvent(ctx, ev)
	}
	emit := func(ev api.Event) error {
		for _, ev := range fitEvent(ev) {
			if err := send(ev); err != nil {
				return err
			}
		}
		return nil
	}
	if p.Hidden {
		ctx = kernel.WithHidden(ctx)
	}
	count, err := s.contexts.Execute(ctx, id, p.Code, p.Env, time.Duration(p.TimeoutMs)*time.Millisecond, emit)
	if err != nil {
		return nil, err
	}
	return nil, send(api.Event{Type: api.EventDone, ExecutionCount: count})
}

// listContexts lists the contexts, with the default contexts of the
// languages p names registered first.
func (s *Server) listContexts(p wire.ContextsParams) ([]api.Context, error) {
	if len(p.Defaults) > len(kernel.Languages) {
		return nil, &api.Error{Code: api.CodeInvalidArgument, Message: "too many default languages"}
	}
	for _, l := range p.Defaults {
		if _, err := s.defaultContext(l); err != nil {
			return nil, err
		}
	}
	return s.contexts.List(), nil
}

// defaultContext returns the default context of language ("": Python).
// The options matter only to a context not made yet: making them reads
// /etc/passwd and stats the home directory's path, ~0.5 ms of a warm
// `1+1` under gVisor.
func (s *Server) defaultContext(language string) (api.Context, error) {
	language = cmp.Or(language, defaultLanguage)
	if c, ok := s.contexts.Made(language); ok {
		return c, nil
	}
	o, err := s.kernelOptions("", "", nil)
	if err != nil {
		return api.Context{}, err
	}
	return s.contexts.Default(language, o)
}

// fitEvent splits output into chunks and slims results so that every
// event fits within the channel's event limit: MIME types other than text/plain are
// dropped, largest first, with a note on stderr.
func fitEvent(ev api.Event) []api.Event {
	if len(ev.Data) > eventChunk {
		var out []api.Event
		for d := ev.Data; len(d) > 0; {
			n := min(len(d), eventChunk)
			part := ev
			part.Data = d[:n:n]
			out = append(out, part)
			d = d[n:]
		}
		return out
	}
	if ev.Result == nil || eventSize(ev) <= channel.MaxEvent-1024 {
		return []api.Event{ev}
	}
	r := *ev.Result
	r.Data = make(map[string]string, len(ev.Result.Data))
	for k, v := range ev.Result.Data {
		r.Data[k] = v
	}
	types := slices.Collect(func(yield func(string) bool) {
		for k := range r.Data {
			if k != "text/plain" && !yield(k) {
				return
			}
		}
	})
	slices.SortFunc(types, func(a, b string) int { return len(r.Data[b]) - len(r.Data[a]) })
	var dropped []string
	fit := ev
	fit.Result = &r
	for _, t := range types {
		if eventSize(fit) <= channel.MaxEvent-1024 {
			break
		}
		dropped = append(dropped, fmt.Sprintf("%s (%d bytes)", t, len(r.Data[t])))
		delete(r.Data, t)
	}
	if tp := r.Data["text/plain"]; eventSize(fit) > channel.MaxEvent-1024 {
		r.Data["text/plain"] = tp[:min(len(tp), eventChunk)]
	}
	note := api.Event{Type: api.EventStderr, Data: fmt.Appendf(nil,
		"[kiln: a result was too large to send; dropped %s]\n", strings.Join(dropped, ", "))}
	return []api.Event{fit, note}
}

func eventSize(ev api.Event) int {
	b, err := json.Marshal(ev)
	if err != nil {
		return 0
	}
	return len(b)
}

// kernelOptions resolves who a context runs as, where, and with which
// environment.
func (s *Server) kernelOptions(user, cwd string, env map[string]string) (kernel.Options, error) {
	acct, err := lookupAccount(user)
	if err != nil {
		return kernel.Options{}, err
	}
	dir, err := kernelDir(cwd, acct.home)
	if err != nil {
		return kernel.Options{}, err
	}
	if err := canEnter(dir, acct); err != nil {
		return kernel.Options{}, err
	}
	return kernel.Options{Cwd: dir, Env: kernelEnv(s.baseEnv(), acct, env, s.cfg.PathDir), UID: acct.uid, GID: acct.gid}, nil
}

// kernelEnv layers defaults, the sandbox's environment, the user's
// identity and the context's variables, with pathDir first on PATH, as
// for processes.
func kernelEnv(base []string, a account, extra map[string]string, pathDir string) []string {
	env := map[string]string{"PATH": process.DefaultPath, "LANG": "C.UTF-8"}
	for _, kv := range base {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			env[k] = v
		}
	}
	env["HOME"], env["USER"], env["LOGNAME"] = a.home, a.name, a.name
	if a.shell != "" {
		env["SHELL"] = a.shell
	}
	for k, v := range extra {
		env[k] = v
	}
	env["PATH"] = process.PrependPath(env["PATH"], pathDir)
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}

// kernelDir resolves a context's working directory: relative to home,
// default home (or "/" when home does not exist).
func kernelDir(dir, home string) (string, error) {
	if strings.ContainsRune(dir, 0) {
		return "", &api.Error{Code: api.CodeInvalidArgument, Message: "working directory contains a NUL byte"}
	}
	if dir == "" {
		if fi, err := os.Stat(home); err != nil || !fi.IsDir() {
			return "/", nil
		}
		return home, nil
	}
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(home, dir)
	}
	dir = filepath.Clean(dir)
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return "", &api.Error{Code: api.CodeNotFound, Message: "working directory " + dir + " does not exist"}
	case err != nil:
		return "", &api.Error{Code: api.CodeInvalidArgument, Message: "working directory " + dir + ": " + err.Error()}
	case !fi.IsDir():
		return "", &api.Error{Code: api.CodeInvalidArgument, Message: "working directory " + dir + " is not a directory"}
	}
	return dir, nil
}

// canEnter checks that a's processes may make dir their working
// directory: search permission on dir and every directory above it, by
// the mode bits for a's uid and primary group (kernels run without
// supplementary groups; this is the kernel's own check less ACLs, and a
// kernel's start reports what it misses). Checked before a kernel starts, so that the caller learns why
// (permission_denied) rather than that the kernel did not come up.
func canEnter(dir string, a account) error {
	if a.uid == 0 {
		return nil
	}
	for p := dir; ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return &api.Error{Code: api.CodeInvalidArgument, Message: "working directory " + dir + ": " + errors.Unwrap(err).Error()}
		}
		if !searchable(fi, a) {
			return &api.Error{Code: api.CodePermissionDenied, Message: fmt.Sprintf(
				"working directory %s: user %s (uid %d) may not enter %s", dir, a.name, a.uid, p)}
		}
		if p == "/" || p == "." {
			return nil
		}
	}
}

// searchable reports whether a may search (x) the directory fi describes.
func searchable(fi os.FileInfo, a account) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return true // not knowable: let the kernel decide
	}
	perm := fi.Mode().Perm()
	switch {
	case st.Uid == a.uid:
		return perm&0o100 != 0
	case st.Gid == a.gid:
		return perm&0o010 != 0
	}
	return perm&0o001 != 0
}
