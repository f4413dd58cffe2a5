package server

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/apikey"
	"github.com/kiln-sh/kiln/internal/edge"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) error {
	var req api.CreateSandboxRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	opts, err := s.createOptions(caller(r), req)
	if err != nil {
		return err
	}
	start := time.Now()
	sb, err := s.m.Create(r.Context(), opts)
	s.edge.ObserveCreate(time.Since(start), err)
	if err != nil {
		return fmt.Errorf("creating sandbox: %w", err)
	}
	edge.Annotate(r, sb.ID.String())
	out := toAPI(sb)
	if n, err := s.m.Network(sb.ID); err == nil && n.Mode == sandbox.NetworkNAT {
		out.Network = toAPINetwork(n)
	}
	return writeJSON(w, http.StatusCreated, out)
}

// quota is what key k may hold at once: its own limits or the server's
// defaults.
func (s *Server) quota(k apikey.Key) sandbox.Quota { return s.edge.Quota(k) }

// createOptions checks what the manager cannot (units, overflow) and adds
// the caller's identity and quota; the manager validates the rest.
func (s *Server) createOptions(k apikey.Key, req api.CreateSandboxRequest) (sandbox.CreateOptions, error) {
	l := req.Limits
	maxTimeout := int64(s.cfg.Limits.MaxSandboxTimeout / time.Second)
	switch {
	case req.Timeout < 0 || req.Timeout > maxTimeout:
		return sandbox.CreateOptions{}, invalid("timeout %d: want seconds in [1, %d], or 0 for the default", req.Timeout, maxTimeout)
	case l.CPUs < 0 || l.MemoryBytes < 0 || l.DiskBytes < 0 || l.Pids < 0:
		return sandbox.CreateOptions{}, invalid("limits must not be negative (0 takes the default)")
	}
	q := s.quota(k)
	return sandbox.CreateOptions{
		Template: req.Template, Runtime: req.Runtime,
		Limits: sandbox.Limits{CPUs: l.CPUs, MemoryBytes: l.MemoryBytes, DiskBytes: l.DiskBytes, Pids: l.Pids},
		Env:    req.Env, Metadata: req.Metadata,
		Timeout: time.Duration(req.Timeout) * time.Second,
		Owner:   k.ID, Quota: q, AutoPause: req.AutoPause, Snapshot: req.Snapshot,
		AutoResume: req.AutoPause, // native auto_pause resumes on use
		Network:    createNetwork(req.Network),
		Volumes:    mountsFromAPI(req.Volumes),
	}, nil
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) error {
	f, err := listFilter(r.URL.Query())
	if err != nil {
		return err
	}
	if f.Owner, err = listOwner(caller(r), r.URL.Query()); err != nil {
		return err
	}
	sbs, next, err := s.records.List(r.Context(), f)
	if err != nil {
		return fmt.Errorf("listing sandboxes: %w", err)
	}
	out := api.SandboxList{Sandboxes: make([]api.Sandbox, 0, len(sbs)), NextPageToken: next}
	for _, sb := range sbs {
		a := toAPI(sb)
		if sb.Owner != caller(r).ID {
			a.Env = nil // an admin sees other keys' sandboxes, not their secrets
		}
		out.Sandboxes = append(out.Sandboxes, a)
	}
	return writeJSON(w, http.StatusOK, out)
}

// listOwner is whose sandboxes a list shows: the caller's own, or with
// ?owner= (admin keys only) another key's, or every key's ("*").
func listOwner(k apikey.Key, q url.Values) (string, error) {
	owner, ok := q["owner"]
	switch {
	case !ok:
		return k.ID, nil
	case !k.Admin:
		return "", fmt.Errorf("owner: only admin keys list other keys' sandboxes: %w", errdefs.ErrPermissionDenied)
	case owner[0] == "*":
		return "", nil
	case owner[0] == "" || len(owner[0]) > 64:
		return "", invalid("owner: want a key id or *")
	}
	return owner[0], nil
}

// listFilter parses ?state=S (repeatable) &metadata.K=V &limit=N
// &page_token=T.
func listFilter(q url.Values) (sandbox.Filter, error) {
	var f sandbox.Filter
	if err := checkQuery(q, "state*", "metadata.", "limit", "page_token", "owner"); err != nil {
		return f, err
	}
	for _, st := range q["state"] {
		switch state := sandbox.State(st); state {
		case sandbox.StateCreating, sandbox.StateRunning, sandbox.StatePaused,
			sandbox.StateStopping, sandbox.StateStopped, sandbox.StateFailed:
			f.States = append(f.States, state)
		default:
			return f, invalid("state %q: want creating, running, paused, stopping, stopped or failed", errdefs.ClipN(st, 32))
		}
	}
	for k, vs := range q {
		if key, ok := strings.CutPrefix(k, "metadata."); ok {
			if f.Metadata == nil {
				f.Metadata = map[string]string{}
			}
			f.Metadata[key] = vs[0]
		}
	}
	limit, err := intParam(q, "limit", 0, 1, 1000)
	if err != nil {
		return f, err
	}
	f.Limit, f.Token = int(limit), q.Get("page_token")
	if len(f.Token) > 512 {
		return f, invalid("page_token too long")
	}
	return f, nil
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.lookup(r)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, toAPI(sb))
}

// killSandbox destroys a sandbox; killing one that already ended
// succeeds.
func (s *Server) killSandbox(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.lookup(r)
	if err != nil {
		return err
	}
	if !sb.State.Terminal() {
		err = s.m.Kill(r.Context(), sb.ID)
	}
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return fmt.Errorf("killing sandbox: %w", err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) error {
	var req api.TimeoutRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	if max := int64(s.cfg.Limits.MaxSandboxTimeout / time.Second); req.Timeout < 1 || req.Timeout > max {
		return invalid("timeout %d: want seconds in [1, %d]", req.Timeout, max)
	}
	sb, err := s.lookup(r)
	if err != nil {
		return err
	}
	if sb, err = s.m.SetTimeout(r.Context(), sb.ID, time.Duration(req.Timeout)*time.Second); err != nil {
		return fmt.Errorf("setting timeout: %w", err)
	}
	return writeJSON(w, http.StatusOK, toAPI(sb))
}

func (s *Server) usage(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.running(r)
	if err != nil {
		return err
	}
	u, err := s.m.Usage(r.Context(), sb.ID)
	if err != nil {
		return fmt.Errorf("reading usage: %w", err)
	}
	return writeJSON(w, http.StatusOK, u)
}

// lookup returns the caller's sandbox named by {id}. Another key's sandbox
// is not found, exactly as an unknown one.
func (s *Server) lookup(r *http.Request) (sandbox.Sandbox, error) {
	id, err := pathID(r)
	if err != nil {
		return sandbox.Sandbox{}, err
	}
	sb, err := s.records.Get(r.Context(), id)
	if err == nil && sb.Owner != caller(r).ID {
		err = errdefs.ErrNotFound
	}
	if errors.Is(err, errdefs.ErrNotFound) {
		return sandbox.Sandbox{}, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return sandbox.Sandbox{}, fmt.Errorf("looking up sandbox: %w", err)
	}
	return sb, nil
}

// pathID parses the sandbox id of the route ({id}) and annotates the
// request with it.
func pathID(r *http.Request) (sandbox.ID, error) {
	raw := r.PathValue("id")
	id, err := sandbox.ParseID(raw)
	if err != nil {
		return "", invalid("sandbox id %q: want 8-32 lowercase letters and digits", errdefs.ClipN(raw, 40))
	}
	edge.Annotate(r, id.String())
	return id, nil
}

// running is lookup for routes that need a running sandbox.
func (s *Server) running(r *http.Request) (sandbox.Sandbox, error) {
	sb, err := s.lookup(r)
	if err == nil {
		err = sb.Running()
	}
	return sb, err
}

// agent returns the agent of the caller's running sandbox {id}.
func (s *Server) agent(r *http.Request) (*sandbox.Agent, error) {
	a, _, err := s.agentFor(r)
	return a, err
}

// agentFor is agent that also returns the sandbox's record. Using a
// sandbox that paused itself at its timeout (auto_pause) resumes it.
func (s *Server) agentFor(r *http.Request) (*sandbox.Agent, sandbox.Sandbox, error) {
	id, err := pathID(r)
	if err != nil {
		return nil, sandbox.Sandbox{}, err
	}
	sb, a, err := s.m.Use(r.Context(), id, caller(r).ID)
	return a, sb, err
}

func toAPI(sb sandbox.Sandbox) api.Sandbox {
	l := sb.Limits
	return api.Sandbox{
		ID: sb.ID.String(), Template: sb.Template, Runtime: sb.Runtime,
		State: string(sb.State), Reason: sb.Reason,
		Limits: api.Limits{CPUs: l.CPUs, MemoryBytes: l.MemoryBytes, DiskBytes: l.DiskBytes, Pids: l.Pids},
		Env:    sb.Env, Metadata: sb.Metadata, Owner: sb.Owner,
		CreatedAt: sb.CreatedAt, ExpiresAt: sb.ExpiresAt, AutoPause: sb.AutoPause,
		Volumes: mountsToAPI(sb.Volumes),
	}
}

// errCode is the code of err for metrics labels; "" for success.
func errCode(err error) string { return edge.CodeLabel(err) }
