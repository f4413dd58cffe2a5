package e2b

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

// The code interpreter (sandbox port 49999), translated onto the agent's
// code contexts. Its errors are plain text, as E2B's server sends them.

// contextCallTimeout bounds context calls, which may start or restart an
// interpreter.
const contextCallTimeout = 2 * time.Minute

// contextIDRE accepts context ids (the agent makes them).
var contextIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// target is the sandbox a code-interpreter request is for.
type target struct {
	sb    sandbox.Sandbox
	a     *sandbox.Agent
	token string
}

type targetKey struct{}

func targetOf(r *http.Request) *target { return r.Context().Value(targetKey{}).(*target) }

func (h *Handler) registerJupyter() {
	h.jupyter.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, "OK")
	})
	h.jupyter.HandleFunc("POST /execute", h.execute)
	h.jupyter.HandleFunc("POST /contexts", h.createContext)
	h.jupyter.HandleFunc("GET /contexts", h.listContexts)
	h.jupyter.HandleFunc("DELETE /contexts/{ctx}", h.deleteContext)
	h.jupyter.HandleFunc("POST /contexts/{ctx}/restart", h.restartContext)
	h.jupyter.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "Not Found", http.StatusNotFound)
	})
}

// serveJupyter serves a code-interpreter request for sandbox sb.
func (h *Handler) serveJupyter(w http.ResponseWriter, r *http.Request, sb sandbox.Sandbox, a *sandbox.Agent) {
	t := &target{sb: sb, a: a, token: h.token(sb.ID)}
	h.jupyter.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), targetKey{}, t)))
}

// contextJSON is a context as E2B's code interpreter shows it.
type contextJSON struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

func toContextJSON(c api.Context) contextJSON {
	return contextJSON{ID: c.ID, Language: c.Language, Cwd: c.Cwd}
}

// language normalises a language name as E2B's server does; "" is
// Python.
func language(l string) string {
	l = strings.ToLower(strings.TrimSpace(l))
	switch l {
	case "":
		return "python"
	case "js":
		return "javascript"
	case "ts":
		return "typescript"
	}
	return l
}

func (h *Handler) createContext(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Language string `json:"language"`
		Cwd      string `json:"cwd"`
	}
	if err := decodeJSON(w, r, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if strings.ContainsRune(req.Cwd, 0) || len(req.Cwd) > 4096 {
		http.Error(w, "invalid cwd", http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), contextCallTimeout)
	defer cancel()
	c, err := targetOf(r).a.CreateContext(ctx, wire.ContextParams{Language: language(req.Language), Cwd: req.Cwd, User: wire.UserDefault})
	if err != nil {
		h.textError(w, r, fmt.Errorf("creating context: %w", err))
		return
	}
	writeJSON(w, http.StatusOK, toContextJSON(c))
}

func (h *Handler) listContexts(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), contextCallTimeout)
	defer cancel()
	// E2B's server creates the Python and JavaScript contexts at start
	// and lists them from then on.
	cs, err := targetOf(r).a.ContextsWithDefaults(ctx, "python", "javascript")
	if err != nil {
		h.textError(w, r, fmt.Errorf("listing contexts: %w", err))
		return
	}
	out := make([]contextJSON, 0, len(cs))
	for _, c := range cs {
		out = append(out, toContextJSON(c))
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *Handler) deleteContext(w http.ResponseWriter, r *http.Request) {
	h.contextCall(w, r, func(ctx context.Context, a *sandbox.Agent, id string) error {
		return a.DeleteContext(ctx, id)
	})
}

func (h *Handler) restartContext(w http.ResponseWriter, r *http.Request) {
	h.contextCall(w, r, func(ctx context.Context, a *sandbox.Agent, id string) error {
		_, err := a.RestartContext(ctx, id)
		return err
	})
}

// contextCall runs call on context {ctx}; it answers null, or 404 "Context
// <id> not found".
func (h *Handler) contextCall(w http.ResponseWriter, r *http.Request, call func(context.Context, *sandbox.Agent, string) error) {
	id := r.PathValue("ctx")
	if !contextIDRE.MatchString(id) {
		http.Error(w, fmt.Sprintf("Context %s not found", errdefs.ClipN(id, 40)), http.StatusNotFound)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), contextCallTimeout)
	defer cancel()
	if err := call(ctx, targetOf(r).a, id); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			http.Error(w, fmt.Sprintf("Context %s not found", id), http.StatusNotFound)
			return
		}
		h.textError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, nil)
}

// textError answers err as plain text with the server's status for it.
func (h *Handler) textError(w http.ResponseWriter, r *http.Request, err error) {
	status, msg := h.problem(r, err)
	http.Error(w, msg, status)
}
