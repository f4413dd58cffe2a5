package e2b

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/kiln-sh/kiln/internal/e2b/envd"
	"github.com/kiln-sh/kiln/internal/edge"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/template"
)

// clientID fills E2B's deprecated, required clientID field.
const clientID = "kiln"

// Timeouts the SDKs rely on when they send none (seconds).
const (
	// defaultTimeout is a sandbox's life when create or connect names
	// none: what the SDKs sent by default until e2b 2.51 stopped sending
	// it. It applies to v1 creates too (E2B's spec says 15 there, but
	// every SDK sent 300), so that both routes behave alike.
	defaultTimeout        = 300
	defaultResumeTimeout  = 15
	defaultRefreshSeconds = 15
)

// templates maps E2B's template names onto Kiln's.
var templates = map[string]string{
	"base":                "base",
	"code-interpreter":    "code-interpreter",
	"code-interpreter-v1": "code-interpreter",
}

// kilnTemplate is the Kiln template reference ("name[:tag]") an E2B
// templateID names: E2B's well-known names map onto Kiln's, keeping the
// tag; other names are Kiln template references, tag and all.
func kilnTemplate(ref string) string {
	name, tag, ok := strings.Cut(ref, ":")
	if t, known := templates[name]; known {
		name = t
	}
	if ok {
		return name + ":" + tag
	}
	return name
}

// handlerFunc is a control-plane handler; its error is answered as E2B's
// error JSON.
type handlerFunc func(w http.ResponseWriter, r *http.Request, c Caller) error

func (h *Handler) registerControl() {
	h.control.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("Health check successful"))
	})
	h.route("POST /sandboxes", h.create) // v1: e2b < 2.51, Python
	h.route("POST /v2/sandboxes", h.create)
	h.route("GET /sandboxes", h.listV1)
	h.route("GET /v2/sandboxes", h.listV2)
	h.route("GET /sandboxes/metrics", h.metricsMany)
	h.route("GET /sandboxes/{id}", h.get)
	h.route("DELETE /sandboxes/{id}", h.kill)
	h.route("POST /sandboxes/{id}/connect", h.connectV1)
	h.route("POST /v2/sandboxes/{id}/connect", h.connectV2)
	h.route("POST /sandboxes/{id}/timeout", h.setTimeout)
	h.route("POST /sandboxes/{id}/refreshes", h.refresh)
	h.route("POST /sandboxes/{id}/pause", h.pause)
	h.route("POST /sandboxes/{id}/resume", h.resume)
	h.route("GET /sandboxes/{id}/metrics", h.metrics)
	h.route("PUT /sandboxes/{id}/network", h.updateNetwork)
	h.route("POST /sandboxes/{id}/fork", h.fork)
	h.route("POST /sandboxes/{id}/snapshots", h.createSnapshot)
	h.route("GET /snapshots", h.listSnapshots)
	h.route("DELETE /templates/{id}", h.deleteTemplate)
	h.registerTemplates()
	h.registerVolumes()
	h.control.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		r.Pattern = "E2B unmatched"
		writeStatus(w, http.StatusNotFound, fmt.Sprintf("%s %s is not part of Kiln's E2B API", r.Method, r.URL.Path))
	})
}

// route registers a control-plane handler behind the caller's API key.
func (h *Handler) route(pattern string, fn handlerFunc) {
	h.control.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		ec, err := h.edge.Authenticate(r, edge.AnyKey)
		if err == nil {
			err = fn(w, r, Caller{Owner: ec.Key.ID, Quota: ec.Quota, Admin: ec.Key.Admin})
		}
		if err != nil {
			h.writeError(w, r, err)
		}
	})
}

// create makes a sandbox. Every sandbox gets an envd access token, also
// for v1 requests with secure=false: the SDKs then simply send it. What
// the body leaves out gets the defaults the SDKs used to send (e2b 2.51
// sends only what its caller set): timeout 300 s, secure, internet
// access on (networkOptions), no auto-pause; CPUs, memory and disk are
// the server's (E2B's SDKs never sent them).
func (h *Handler) create(w http.ResponseWriter, r *http.Request, c Caller) error {
	var req newSandbox
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	if req.TemplateID == "" {
		req.TemplateID = "base"
	}
	timeout := int64(defaultTimeout)
	if req.Timeout != nil && *req.Timeout > 0 {
		timeout = *req.Timeout
	}
	opts := sandbox.CreateOptions{
		Template: kilnTemplate(req.TemplateID), Env: req.EnvVars, Metadata: req.Metadata,
		Timeout: seconds(timeout), Owner: c.Owner, Quota: c.Quota,
		Network: networkOptions(req.AllowInternetAccess, req.Network),
		// autoPause (lifecycle.onTimeout "pause") and autoResume are kept
		// in the record, so they survive a restart of kiln serve.
		AutoPause: req.AutoPause, AutoResume: req.AutoResume != nil && req.AutoResume.Enabled,
		AutoPauseFiles: req.AutoPauseMemory != nil && !*req.AutoPauseMemory,
		Volumes:        createMounts(req.VolumeMounts),
	}
	h.fromSnapshot(r.Context(), &opts, req.TemplateID)
	var sb sandbox.Sandbox
	err := errdefs.ErrNotFound
	if _, _, refErr := template.ParseRef(opts.Template); opts.Snapshot != "" || refErr == nil {
		start := time.Now()
		sb, err = h.m.Create(r.Context(), opts)
		h.edge.ObserveCreate(time.Since(start), err)
	}
	if errors.Is(err, errdefs.ErrNotFound) { // only the template can be missing
		writeStatus(w, http.StatusNotFound, fmt.Sprintf("template '%s' not found", errdefs.ClipN(req.TemplateID, 64)))
		return nil
	}
	if err != nil {
		return fmt.Errorf("creating sandbox: %w", err)
	}
	edge.Annotate(r, sb.ID.String())
	writeJSON(w, http.StatusCreated, h.sandboxJSON(sb, req.TemplateID))
	return nil
}

func (h *Handler) sandboxJSON(sb sandbox.Sandbox, alias string) sandboxJSON {
	if alias == "" {
		alias = sb.Template
	}
	return sandboxJSON{
		SandboxID: sb.ID.String(), TemplateID: sb.Template, Alias: alias, ClientID: clientID,
		EnvdVersion: envd.Version, EnvdAccessToken: h.token(sb.ID), Domain: h.domain(),
		TrafficAccessToken: h.trafficToken(sb.ID),
	}
}

func (h *Handler) domain() *string {
	if h.o.Domain == "" {
		return nil
	}
	d := h.o.Domain
	return &d
}

// listed is a sandbox as the list endpoints show it.
func listed(sb sandbox.Sandbox) listedSandbox {
	md := sb.Metadata
	if md == nil {
		md = map[string]string{}
	}
	end := sb.ExpiresAt
	if end.IsZero() {
		end = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)
	}
	return listedSandbox{
		SandboxID: sb.ID.String(), TemplateID: sb.Template, Alias: sb.Template, ClientID: clientID,
		CPUCount: cpuCount(sb.Limits.CPUs), MemoryMB: sb.Limits.MemoryBytes >> 20, DiskSizeMB: sb.Limits.DiskBytes >> 20,
		StartedAt: stampOf(sb.CreatedAt), EndAt: stampOf(end), EnvdVersion: envd.Version, State: string(sb.State), Metadata: md,
	}
}

// cpuCount rounds a fractional CPU limit up to E2B's whole CPUs.
func cpuCount(cpus float64) int { return max(1, int(math.Ceil(cpus))) }

func (h *Handler) get(w http.ResponseWriter, r *http.Request, c Caller) error {
	sb, err := h.lookup(r, c)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, sandboxDetail{
		listedSandbox: listed(sb), EnvdAccessToken: h.token(sb.ID), Domain: h.domain(),
		Lifecycle:    lifecycle{OnTimeout: onTimeout(sb), AutoResume: sb.AutoResume},
		VolumeMounts: shownMounts(sb.Volumes),
	})
	return nil
}

// lookup returns the caller's live (running or paused) sandbox {id}; any
// other sandbox is not found, as on E2B, where ended sandboxes are gone.
func (h *Handler) lookup(r *http.Request, c Caller) (sandbox.Sandbox, error) {
	raw := r.PathValue("id")
	edge.Annotate(r, raw)
	notFound := fmt.Errorf("sandbox \"%s\" not found: %w", errdefs.ClipN(raw, 40), errdefs.ErrNotFound)
	id, err := sandbox.ParseID(raw)
	if err != nil {
		return sandbox.Sandbox{}, notFound
	}
	sb, err := h.m.Get(r.Context(), id)
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		return sb, notFound
	case err != nil:
		return sb, fmt.Errorf("looking up sandbox: %w", err)
	case sb.Owner != c.Owner || sb.State.Terminal():
		return sb, notFound
	}
	return sb, nil
}

// kill kills a sandbox; one that is gone is not found (the SDK then
// returns false).
func (h *Handler) kill(w http.ResponseWriter, r *http.Request, c Caller) error {
	sb, err := h.lookup(r, c)
	if err != nil {
		return err
	}
	h.dying.Store(sb.ID, struct{}{})
	defer h.dying.Delete(sb.ID)
	if err := h.m.Kill(r.Context(), sb.ID); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return fmt.Errorf("sandbox \"%s\" not found: %w", sb.ID, errdefs.ErrNotFound)
		}
		return fmt.Errorf("killing sandbox: %w", err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// setTimeout makes the sandbox expire timeout seconds from now (it may
// shorten its life); 0 expires it now, as on E2B: a running sandbox is
// killed, or paused if its lifecycle says so, before the answer.
func (h *Handler) setTimeout(w http.ResponseWriter, r *http.Request, c Caller) error {
	var req timeoutRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	if req.Timeout == nil {
		return fmt.Errorf("timeout is required: %w", errdefs.ErrInvalidArgument)
	}
	sb, err := h.lookup(r, c)
	if err != nil {
		return err
	}
	if *req.Timeout == 0 {
		// A paused sandbox has expired already: it stays as it is.
		if sb.State == sandbox.StateRunning {
			h.dying.Store(sb.ID, struct{}{}) // see kill
			defer h.dying.Delete(sb.ID)
			if _, err := h.m.ExpireNow(r.Context(), sb.ID); err != nil {
				return fmt.Errorf("expiring sandbox: %w", err)
			}
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	if _, err := h.m.SetTimeout(r.Context(), sb.ID, seconds(*req.Timeout)); err != nil {
		return fmt.Errorf("setting timeout: %w", err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// refresh keeps a sandbox alive for duration more seconds; it never
// shortens its life.
func (h *Handler) refresh(w http.ResponseWriter, r *http.Request, c Caller) error {
	var req refreshRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	sb, err := h.lookup(r, c)
	if err != nil {
		return err
	}
	d := int64(defaultRefreshSeconds)
	if req.Duration != nil && *req.Duration > 0 {
		d = *req.Duration
	}
	if err := h.extend(r.Context(), sb, d); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// seconds is n seconds, capped at E2B's int32 so that it cannot
// overflow (the Manager refuses it as too long).
func seconds(n int64) time.Duration { return time.Duration(min(n, math.MaxInt32)) * time.Second }

// extend makes sb live at least n seconds from now.
func (h *Handler) extend(ctx context.Context, sb sandbox.Sandbox, n int64) error {
	d := seconds(n)
	if !sb.ExpiresAt.IsZero() && time.Now().Add(d).Before(sb.ExpiresAt) {
		return nil
	}
	if _, err := h.m.SetTimeout(ctx, sb.ID, d); err != nil {
		return fmt.Errorf("extending the sandbox's timeout: %w", err)
	}
	return nil
}

func (h *Handler) connectV1(w http.ResponseWriter, r *http.Request, c Caller) error {
	return h.connect(w, r, c)
}

func (h *Handler) connectV2(w http.ResponseWriter, r *http.Request, c Caller) error {
	return h.connect(w, r, c)
}

// connect returns a running sandbox (200), resuming a paused one first
// (201); its timeout is only ever extended.
func (h *Handler) connect(w http.ResponseWriter, r *http.Request, c Caller) error {
	var req connectRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	timeout := int64(defaultTimeout)
	if req.Timeout != nil && *req.Timeout > 0 {
		timeout = *req.Timeout
	}
	sb, status, err := h.running(r, c, req.Memory == nil || *req.Memory)
	if err != nil {
		return err
	}
	if err := h.extend(r.Context(), sb, timeout); err != nil {
		return err
	}
	writeJSON(w, status, h.sandboxJSON(sb, ""))
	return nil
}

// running returns the caller's sandbox {id} running, resuming it if it
// is paused (without memory, booting it afresh on its files); the status
// says which (200 running, 201 resumed).
func (h *Handler) running(r *http.Request, c Caller, memory bool) (sandbox.Sandbox, int, error) {
	sb, err := h.lookup(r, c)
	if err != nil {
		return sb, 0, err
	}
	switch sb.State {
	case sandbox.StateRunning:
		return sb, http.StatusOK, nil
	case sandbox.StatePaused:
		sb, err := h.resumeSandbox(r.Context(), sb.ID, memory)
		if err != nil {
			return sb, 0, err
		}
		return sb, http.StatusCreated, nil
	}
	return sb, 0, fmt.Errorf("sandbox %s is %s: %w", sb.ID, sb.State, errdefs.ErrFailedPrecondition)
}

// resumeSandbox resumes paused sandbox id: with its memory if it has it,
// else (or without memory) booted afresh on its files.
func (h *Handler) resumeSandbox(ctx context.Context, id sandbox.ID, memory bool) (sandbox.Sandbox, error) {
	resume := h.m.Resume
	if !memory {
		resume = h.m.Reboot
	}
	sb, err := resume(ctx, id)
	if err != nil {
		return sb, fmt.Errorf("resuming sandbox: %w", err)
	}
	return sb, nil
}

// pause pauses a running sandbox, with its memory unless the body says
// memory false (then its files only: processes start over at the
// resume); a paused one is a conflict (the SDK then returns false).
func (h *Handler) pause(w http.ResponseWriter, r *http.Request, c Caller) error {
	var req pauseRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	sb, err := h.lookup(r, c)
	if err != nil {
		return err
	}
	if sb.State == sandbox.StatePaused {
		writeStatus(w, http.StatusConflict, fmt.Sprintf("sandbox \"%s\" is already paused", sb.ID))
		return nil
	}
	pause := h.m.Pause
	if req.Memory != nil && !*req.Memory {
		pause = h.m.PauseFiles
	}
	if _, err := pause(r.Context(), sb.ID); err != nil {
		return fmt.Errorf("pausing sandbox: %w", err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// resume is the deprecated resume: a paused sandbox is resumed (201), a
// running one is a conflict.
func (h *Handler) resume(w http.ResponseWriter, r *http.Request, c Caller) error {
	var req connectRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	sb, err := h.lookup(r, c)
	if err != nil {
		return err
	}
	if sb.State != sandbox.StatePaused {
		writeStatus(w, http.StatusConflict, fmt.Sprintf("sandbox \"%s\" is already running", sb.ID))
		return nil
	}
	if sb, err = h.resumeSandbox(r.Context(), sb.ID, req.Memory == nil || *req.Memory); err != nil {
		return err
	}
	timeout := int64(defaultResumeTimeout)
	if req.Timeout != nil && *req.Timeout > 0 {
		timeout = *req.Timeout
	}
	if err := h.extend(r.Context(), sb, timeout); err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, h.sandboxJSON(sb, ""))
	return nil
}
