package server

import (
	"context"
	"fmt"
	"net/http"
	"regexp"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/template"
	"github.com/kiln-sh/kiln/internal/template/builder"
)

// startBuild starts a build of the caller's template (202): the recipe is
// validated, its base must be a template the caller can use, and its
// resources within the server's limits; over the concurrent builds
// allowed (per key or in total) it answers 429.
func (s *Server) startBuild(w http.ResponseWriter, r *http.Request) error {
	if err := s.templatesOn(); err != nil {
		return err
	}
	var req api.TemplateBuildRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	name, tag, err := template.ParseRef(req.Template)
	if err != nil {
		return err
	}
	if err := builder.CheckResources(req.Spec, s.cfg.Limits); err != nil {
		return err
	}
	k := caller(r)
	if base := req.Spec.From.Template; base != "" {
		if _, err := s.catalog.Resolve(r.Context(), k.ID, base); err != nil {
			return fmt.Errorf("from: %w", err)
		}
	}
	// A rebuild keeps a public template public (PATCH makes it private).
	rec, err := s.builder.Start(r.Context(), k.ID, name+":"+tag, req.Spec, req.Public)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusAccepted, buildToAPI(rec, tag))
}

// listBuilds lists the caller's builds (an admin: everyone's), newest
// first, of ?template= if given.
func (s *Server) listBuilds(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	if err := checkQuery(q, "template", "limit"); err != nil {
		return err
	}
	if err := s.templatesOn(); err != nil {
		return err
	}
	name := q.Get("template")
	if name != "" && !template.ValidName(name) {
		return invalid("template %q: want a template name (1-63 lowercase letters, digits, '.', '_' or '-')", errdefs.ClipN(name, 80))
	}
	limit, err := intParam(q, "limit", 20, 1, 1000)
	if err != nil {
		return err
	}
	k := caller(r)
	owner := k.ID
	if k.Admin {
		owner = ""
	}
	recs, err := s.builder.List(r.Context(), owner, name, int(limit))
	if err != nil {
		return fmt.Errorf("listing builds: %w", err)
	}
	tags, err := s.tmpl.ListTags(r.Context(), owner, name)
	if err != nil {
		return fmt.Errorf("listing builds: %w", err)
	}
	tagOf := map[string]string{}
	for _, t := range tags {
		if _, ok := tagOf[t.BuildID]; !ok || t.Tag == template.DefaultTag {
			tagOf[t.BuildID] = t.Tag
		}
	}
	out := api.TemplateBuildList{Builds: make([]api.TemplateBuild, 0, len(recs))}
	for _, rec := range recs {
		out.Builds = append(out.Builds, buildToAPI(rec, tagOf[rec.ID]))
	}
	return writeJSON(w, http.StatusOK, out)
}

// buildIDRE is the form of build ids (builder's: 'b' and 24 base-32
// digits; the catalog accepts a wider form).
var buildIDRE = regexp.MustCompile(`^[a-z0-9]{8,40}$`)

// visibleBuild returns build id if the caller may see it: its own, or
// any for an admin; else not found.
func (s *Server) visibleBuild(r *http.Request, id string) (template.BuildRecord, error) {
	if !buildIDRE.MatchString(id) {
		return template.BuildRecord{}, invalid("build id %q: want the id a build was started with", errdefs.ClipN(id, 64))
	}
	rec, err := s.builder.Get(r.Context(), id)
	k := caller(r)
	if err == nil && rec.Owner != k.ID && !k.Admin {
		err = fmt.Errorf("template build %q: %w", id, errdefs.ErrNotFound)
	}
	return rec, err
}

// getBuild returns one of the caller's builds.
func (s *Server) getBuild(w http.ResponseWriter, r *http.Request) error {
	if err := s.templatesOn(); err != nil {
		return err
	}
	rec, err := s.visibleBuild(r, r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, buildToAPI(rec, s.tagOf(r.Context(), rec)))
}

// tagOf is a tag that points at the build ("" if none does).
func (s *Server) tagOf(ctx context.Context, rec template.BuildRecord) string {
	tags, err := s.tmpl.ListTags(ctx, rec.Owner, rec.Template)
	if err != nil {
		return ""
	}
	tag := ""
	for _, t := range tags {
		if t.BuildID == rec.ID && (tag == "" || t.Tag == template.DefaultTag) {
			tag = t.Tag
		}
	}
	return tag
}

// buildLogs streams a build's log from ?offset (an entry index) as NDJSON
// or WebSocket messages, like command events; with ?follow=true until the
// build ends.
func (s *Server) buildLogs(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	if err := checkQuery(q, "offset", "follow"); err != nil {
		return err
	}
	if err := s.templatesOn(); err != nil {
		return err
	}
	offset, err := intParam(q, "offset", 0, 0, 1<<31-1)
	if err != nil {
		return err
	}
	follow, err := boolParam(q, "follow")
	if err != nil {
		return err
	}
	if isWebSocket(r) && r.Method != http.MethodGet {
		return invalid("WebSocket streams need GET")
	}
	rec, err := s.visibleBuild(r, r.PathValue("id"))
	if err != nil {
		return err
	}
	st := s.newStream(w, r)
	err = s.builder.Logs(st.ctx, rec.ID, int(offset), follow, func(e builder.LogEntry) error { return st.sendValue(e) })
	return st.finish(err)
}

// buildToAPI is a build record as the API shows it; tag is the tag it
// was started for or one that points at it ("": none). The record has
// all of it (the builder counts the steps as they end): no log is read.
func buildToAPI(rec template.BuildRecord, tag string) api.TemplateBuild {
	spec := rec.Spec
	b := api.TemplateBuild{
		ID: rec.ID, Template: rec.Template, Tag: tag, Owner: rec.Owner, Status: rec.Status, Reason: rec.Reason,
		CreatedAt: rec.CreatedAt, Steps: len(rec.Spec.Steps), StepsDone: rec.StepsDone, CachedSteps: rec.CachedSteps,
		Layers: len(rec.Layers), Spec: &spec, Image: rec.Image,
		Warm: rec.Status == template.BuildReady && rec.Config.StartCmd != "",
	}
	if !rec.StartedAt.IsZero() {
		started := rec.StartedAt
		b.StartedAt = &started
	}
	if !rec.FinishedAt.IsZero() {
		finished := rec.FinishedAt
		b.FinishedAt = &finished
	}
	return b
}
