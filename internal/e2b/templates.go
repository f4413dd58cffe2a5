package e2b

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/template"
	"github.com/kiln-sh/kiln/internal/template/builder"
)

// E2B's template build API on Kiln's engine (internal/template/builder):
// a templateID is the template's name, which each key owns apart (as on
// Kiln's own /v1/templates, whose access rules, uploads and limits these
// routes share); names are "name" or "name:tag". The SDK's steps are
// Kiln's (api.TemplateStep was made E2B-shaped), so a recipe maps one to
// one.

// imageTemplates maps E2B's base images onto Kiln's built-in templates
// (an image Kiln cannot map is pulled from its registry).
var imageTemplates = map[string]string{
	"e2bdev/base":             "base",
	"e2bdev/code-interpreter": "code-interpreter",
}

// pendingTTL bounds how long the settings of a requested build wait for
// its steps; maxPending how many builds may wait at once.
const (
	pendingTTL = time.Hour
	maxPending = 10000
)

// pendingBuild is what POST /v3/templates said about a build that the
// steps post starts: its tags and resources.
type pendingBuild struct {
	tags     []string
	cpus     int
	memoryMB int
	at       time.Time
}

// pendingBuilds are the builds requested and not yet started, by id. A
// restart of kiln serve fails them (builder.New), so memory is enough.
type pendingBuilds struct {
	mu sync.Mutex
	m  map[string]pendingBuild
}

func (p *pendingBuilds) put(id string, b pendingBuild) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = map[string]pendingBuild{}
	}
	for k, v := range p.m {
		if time.Since(v.at) > pendingTTL {
			delete(p.m, k)
		}
	}
	if len(p.m) >= maxPending {
		return fmt.Errorf("%d template builds are waiting for their steps: %w", len(p.m), errdefs.ErrResourceExhausted)
	}
	p.m[id] = b
	return nil
}

func (p *pendingBuilds) get(id string) (pendingBuild, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	b, ok := p.m[id]
	return b, ok
}

func (p *pendingBuilds) drop(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.m, id)
}

func (h *Handler) registerTemplates() {
	h.route("POST /v3/templates", h.requestBuild)
	h.route("POST /v2/templates/{templateID}/builds/{buildID}", h.startBuild)
	h.route("GET /templates/{templateID}/builds/{buildID}/status", h.buildStatus)
	h.route("GET /templates/{templateID}/files/{hash}", h.fileUploadLink)
	h.control.HandleFunc("PUT /templates/{templateID}/files/{hash}", h.uploadFiles)
	// /templates/aliases/{alias} and /templates/{templateID}/tags overlap
	// as patterns: one route serves both.
	h.route("GET /templates/{first}/{second}", h.aliasOrTags)
	h.route("POST /templates/tags", h.assignTags)
	h.route("DELETE /templates/tags", h.removeTags)
	h.route("GET /templates", h.listTemplates)
	h.route("GET /v2/templates", h.listTemplates)
	h.route("PATCH /v2/templates/{templateID}", h.setPublic)
}

// errNoTemplates answers the template routes of a server without a
// builder.
var errNoTemplates = fmt.Errorf("template builds are not enabled on this server: %w", errdefs.ErrUnavailable)

func (h *Handler) templatesOn() error {
	if h.o.Builder == nil || h.o.Catalog == nil || h.o.Catalog.Store == nil {
		return errNoTemplates
	}
	return nil
}

func (c Caller) template() template.Caller { return template.Caller{ID: c.Owner, Admin: c.Admin} }

// invalid is an invalid_argument error.
func invalid(format string, a ...any) error {
	return fmt.Errorf(format+": %w", append(a, errdefs.ErrInvalidArgument)...)
}

// requestBuild is POST /v3/templates: it names a build of the caller's
// template (waiting for its steps) and answers its ids (202).
func (h *Handler) requestBuild(w http.ResponseWriter, r *http.Request, c Caller) error {
	if err := h.templatesOn(); err != nil {
		return err
	}
	var req templateBuildRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	ref := cmpOr(req.Name, req.Alias)
	if ref == "" {
		return invalid("Name is required")
	}
	name, tag, hasTag := strings.Cut(ref, ":")
	if _, ok := templates[name]; ok {
		return invalid("template name '%s' is reserved for one of Kiln's built-in templates", name)
	}
	var tags []string
	if hasTag {
		tags = append(tags, tag)
	}
	for _, t := range append(tags, req.Tags...) {
		if _, _, err := template.ParseRef(name + ":" + t); err != nil {
			return err
		}
		if !slices.Contains(tags, t) {
			tags = append(tags, t)
		}
	}
	if len(tags) == 0 {
		tags = []string{template.DefaultTag}
	}
	p := pendingBuild{tags: tags, at: time.Now()}
	if req.CPUCount != nil {
		p.cpus = *req.CPUCount
	}
	if req.MemoryMB != nil {
		p.memoryMB = *req.MemoryMB
	}
	if err := builder.CheckResources(api.TemplateSpec{CPUs: p.cpus, MemoryMB: p.memoryMB}, h.o.Limits); err != nil {
		return err
	}
	rec, err := h.o.Builder.Reserve(r.Context(), c.Owner, name)
	if err != nil {
		return err
	}
	if err := h.pending.put(rec.ID, p); err != nil {
		return err
	}
	public := false
	if own, err := h.o.Catalog.Store.ListTags(r.Context(), c.Owner, name); err == nil && len(own) > 0 {
		public = own[0].Public
	}
	names := make([]string, 0, len(tags))
	for _, t := range tags {
		names = append(names, name+":"+t)
	}
	writeJSON(w, http.StatusAccepted, templateRequestResponse{TemplateID: name, BuildID: rec.ID, Public: public,
		Names: names, Tags: tags, Aliases: []string{name}})
	return nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// startBuild is POST /v2/templates/{templateID}/builds/{buildID}: the
// recipe of a requested build, which starts it (202).
func (h *Handler) startBuild(w http.ResponseWriter, r *http.Request, c Caller) error {
	if err := h.templatesOn(); err != nil {
		return err
	}
	var req templateBuildStart
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	rec, err := h.visibleBuild(r, c)
	if err != nil {
		return err
	}
	spec, err := h.recipe(r, c, req)
	if err != nil {
		return err
	}
	// A refused recipe leaves the build waiting for a better one.
	p, _ := h.pending.get(rec.ID)
	spec.CPUs, spec.MemoryMB = p.cpus, p.memoryMB
	if _, err := h.o.Builder.StartReserved(r.Context(), rec.Owner, rec.ID, p.tags, spec, false); err != nil {
		return err
	}
	h.pending.drop(rec.ID)
	w.WriteHeader(http.StatusAccepted)
	return nil
}

// recipe is the Kiln recipe of an E2B build start.
func (h *Handler) recipe(r *http.Request, c Caller, req templateBuildStart) (api.TemplateSpec, error) {
	spec := api.TemplateSpec{StartCmd: req.StartCmd, ReadyCmd: req.ReadyCmd, NoCache: req.Force}
	switch {
	case req.FromTemplate != "" && req.FromImage != "":
		return spec, invalid("fromTemplate and fromImage: give one")
	case req.FromTemplate != "":
		spec.From.Template = kilnTemplate(req.FromTemplate)
	case req.FromImage != "":
		if t, ok := imageTemplates[imageName(req.FromImage)]; ok {
			spec.From.Template = t
		} else {
			spec.From.Image = req.FromImage
		}
	default:
		spec.From.Template = "base" // the SDK's default image, e2bdev/base
	}
	if reg := req.FromImageRegistry; reg != nil {
		if reg.Type != "registry" {
			return spec, invalid("fromImageRegistry type '%s': Kiln pulls with a username and password (type 'registry') only", errdefs.ClipN(reg.Type, 20))
		}
		if spec.From.Image == "" {
			return spec, invalid("fromImageRegistry goes with fromImage")
		}
		spec.From.Registry = &api.RegistryAuth{Username: reg.Username, Password: reg.Password}
	}
	if base := spec.From.Template; base != "" {
		if _, err := h.o.Catalog.Resolve(r.Context(), c.Owner, base); err != nil {
			if errors.Is(err, errdefs.ErrNotFound) {
				return spec, invalid("base template '%s' not found", errdefs.ClipN(req.FromTemplate, 64))
			}
			return spec, fmt.Errorf("base template: %w", err)
		}
	}
	for _, st := range req.Steps {
		spec.Steps = append(spec.Steps, api.TemplateStep{Type: st.Type, Args: st.Args, FilesHash: st.FilesHash, Force: st.Force})
	}
	return spec, nil
}

// imageName is an image reference without a docker.io/ prefix and without
// a :latest tag, as imageTemplates names images.
func imageName(ref string) string {
	ref = strings.TrimPrefix(strings.TrimPrefix(ref, "docker.io/"), "index.docker.io/")
	return strings.TrimSuffix(ref, ":latest")
}

// visibleBuild is build {buildID} of template {templateID} if the caller
// may see it: its own, or any for an admin; else not found.
func (h *Handler) visibleBuild(r *http.Request, c Caller) (template.BuildRecord, error) {
	id, name := r.PathValue("buildID"), r.PathValue("templateID")
	notFound := fmt.Errorf("template build '%s' not found: %w", errdefs.ClipN(id, 64), errdefs.ErrNotFound)
	if !template.ValidName(id) {
		return template.BuildRecord{}, notFound
	}
	rec, err := h.o.Builder.Get(r.Context(), id)
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		return rec, notFound
	case err != nil:
		return rec, err
	case rec.Owner != c.Owner && !c.Admin || rec.Template != name:
		return rec, notFound
	}
	return rec, nil
}
