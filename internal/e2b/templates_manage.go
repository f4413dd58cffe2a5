package e2b

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/kiln-sh/kiln/internal/e2b/envd"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/template"
)

// Managing built templates through E2B's API: Template.exists, the tag
// helpers, the lists, public and delete.

// visibleTags are the tags of template name the caller can see: its own
// (an admin: any key's), else a public one's.
func (h *Handler) visibleTags(r *http.Request, c Caller, name string) ([]template.TagRecord, error) {
	st := h.o.Catalog.Store
	owner := c.Owner
	if c.Admin {
		owner = ""
	}
	tags, err := st.ListTags(r.Context(), owner, name)
	if err == nil && len(tags) == 0 {
		tags, err = st.PublicTags(r.Context(), name)
	}
	return tags, err
}

// aliasOrTags serves GET /templates/aliases/{alias} (Template.exists: 200
// for a template the caller can use, a built-in included; 404 else,
// another key's private one too) and GET /templates/{templateID}/tags.
func (h *Handler) aliasOrTags(w http.ResponseWriter, r *http.Request, c Caller) error {
	first, second := r.PathValue("first"), r.PathValue("second")
	if first != "aliases" && second != "tags" {
		writeStatus(w, http.StatusNotFound, fmt.Sprintf("%s %s is not part of Kiln's E2B API", r.Method, errdefs.ClipN(r.URL.Path, 80)))
		return nil
	}
	if err := h.templatesOn(); err != nil {
		return err
	}
	name := first
	if first == "aliases" {
		name = second
	}
	var tags []template.TagRecord
	if template.ValidName(name) {
		var err error
		if tags, err = h.visibleTags(r, c, name); err != nil {
			return err
		}
	}
	if first == "aliases" {
		if _, builtin := templates[name]; builtin {
			writeJSON(w, http.StatusOK, aliasJSON{TemplateID: kilnTemplate(name), Public: true})
			return nil
		}
		if len(tags) == 0 {
			return fmt.Errorf("template '%s' not found: %w", errdefs.ClipN(name, 64), errdefs.ErrNotFound)
		}
		writeJSON(w, http.StatusOK, aliasJSON{TemplateID: name, Public: tags[0].Public})
		return nil
	}
	if len(tags) == 0 {
		return fmt.Errorf("template '%s' not found: %w", errdefs.ClipN(name, 64), errdefs.ErrNotFound)
	}
	out := make([]templateTag, 0, len(tags))
	for _, t := range tags {
		out = append(out, templateTag{Tag: t.Tag, BuildID: t.BuildID, CreatedAt: stampOf(t.UpdatedAt)})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// assignTags is POST /templates/tags: tags point at the build that target
// ("name:tag") points at, in a template the caller may change (201).
func (h *Handler) assignTags(w http.ResponseWriter, r *http.Request, c Caller) error {
	if err := h.templatesOn(); err != nil {
		return err
	}
	var req tagsRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	name, tag, err := template.ParseRef(req.Target)
	if err != nil {
		return err
	}
	if len(req.Tags) == 0 {
		return invalid("tags: want at least one")
	}
	for _, t := range req.Tags {
		if _, _, err := template.ParseRef(name + ":" + t); err != nil {
			return err
		}
	}
	owner, err := h.o.Catalog.OwnerOf(r.Context(), c.template(), name)
	if err != nil {
		return err
	}
	st := h.o.Catalog.Store
	target, err := st.GetTag(r.Context(), owner, name, tag)
	if err != nil {
		return err
	}
	for _, t := range req.Tags {
		target.Tag, target.UpdatedAt = t, time.Now().UTC()
		if err := st.PutTag(r.Context(), target); err != nil {
			return fmt.Errorf("tagging %s:%s: %w", name, t, err)
		}
	}
	writeJSON(w, http.StatusCreated, tagsResponse{BuildID: target.BuildID, Tags: req.Tags})
	return nil
}

// removeTags is DELETE /templates/tags: the tags go; their builds stay
// until the template is deleted (204).
func (h *Handler) removeTags(w http.ResponseWriter, r *http.Request, c Caller) error {
	if err := h.templatesOn(); err != nil {
		return err
	}
	var req untagRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	name, _, err := template.ParseRef(req.Name)
	if err != nil {
		return err
	}
	if len(req.Tags) == 0 {
		return invalid("tags: want at least one")
	}
	owner, err := h.o.Catalog.OwnerOf(r.Context(), c.template(), name)
	if err != nil {
		return err
	}
	for _, t := range req.Tags {
		if err := h.o.Catalog.Store.DeleteTag(r.Context(), owner, name, t); err != nil {
			return err
		}
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// listTemplates is GET /templates and GET /v2/templates: the caller's
// templates (an admin's: its own too), one per name, newest first, paged
// by limit and nextToken.
func (h *Handler) listTemplates(w http.ResponseWriter, r *http.Request, c Caller) error {
	if err := h.templatesOn(); err != nil {
		return err
	}
	q := r.URL.Query()
	limit, err := pageLimit(q.Get("limit"))
	if err != nil {
		return err
	}
	tags, err := h.o.Catalog.Store.ListTags(r.Context(), c.Owner, "")
	if err != nil {
		return fmt.Errorf("listing templates: %w", err)
	}
	var out []templateJSON
	for i := 0; i < len(tags); {
		j := i
		for j < len(tags) && tags[j].Name == tags[i].Name {
			j++
		}
		out = append(out, h.templateJSON(r, tags[i:j]))
		i = j
	}
	key := func(t templateJSON) (time.Time, string) { return time.Time(t.UpdatedAt), t.TemplateID }
	page, next, err := paginate(out, key, true, q.Get("nextToken"), limit)
	if err != nil {
		return err
	}
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	writeJSON(w, http.StatusOK, append([]templateJSON{}, page...))
	return nil
}

// templateJSON is one template (its tags, all of one name) as E2B lists
// it: its default tag's build (else its newest tag's).
func (h *Handler) templateJSON(r *http.Request, tags []template.TagRecord) templateJSON {
	t := tags[0]
	for _, o := range tags {
		if o.Tag == template.DefaultTag || t.Tag != template.DefaultTag && o.UpdatedAt.After(t.UpdatedAt) {
			t = o
		}
	}
	l := h.o.Limits
	out := templateJSON{TemplateID: t.Name, BuildID: t.BuildID, Public: t.Public, Aliases: []string{t.Name},
		CreatedAt: stampOf(t.UpdatedAt), UpdatedAt: stampOf(t.UpdatedAt), EnvdVersion: envd.Version, BuildStatus: template.BuildReady,
		CPUCount: cpuCount(l.DefaultCPUs), MemoryMB: l.DefaultMemoryBytes >> 20, DiskSizeMB: l.DefaultDiskBytes >> 20}
	for _, o := range tags {
		out.Names = append(out.Names, o.Name+":"+o.Tag)
		out.UpdatedAt = stampOf(later(time.Time(out.UpdatedAt), o.UpdatedAt))
	}
	if rec, err := h.o.Builder.Get(r.Context(), t.BuildID); err == nil {
		out.CreatedAt = stampOf(rec.CreatedAt)
		if rec.Spec.CPUs > 0 {
			out.CPUCount = rec.Spec.CPUs
		}
		if rec.Spec.MemoryMB > 0 {
			out.MemoryMB = int64(rec.Spec.MemoryMB)
		}
		if rec.Spec.DiskMB > 0 {
			out.DiskSizeMB = int64(rec.Spec.DiskMB)
		}
	}
	if builds, err := h.o.Builder.List(r.Context(), t.Owner, t.Name, 1000); err == nil {
		out.BuildCount = len(builds)
	}
	return out
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// setPublic is PATCH /v2/templates/{templateID} {public}: every key may
// use the template (not change it), or only its owner's.
func (h *Handler) setPublic(w http.ResponseWriter, r *http.Request, c Caller) error {
	if err := h.templatesOn(); err != nil {
		return err
	}
	var req publicRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	if req.Public == nil {
		return invalid("public: required (true or false)")
	}
	name, _, err := template.ParseRef(r.PathValue("templateID"))
	if err != nil {
		return err
	}
	owner, err := h.o.Catalog.OwnerOf(r.Context(), c.template(), name)
	if err != nil {
		return err
	}
	if err := h.o.Catalog.Store.SetPublic(r.Context(), owner, name, *req.Public); err != nil {
		return err
	}
	tags, err := h.o.Catalog.Store.ListTags(r.Context(), owner, name)
	if err != nil {
		return err
	}
	names := []string{}
	for _, t := range tags {
		names = append(names, t.Name+":"+t.Tag)
	}
	writeJSON(w, http.StatusOK, map[string][]string{"names": names})
	return nil
}

// deleteCustomTemplate deletes the caller's template ref: "name:tag" that
// tag, "name" every tag; with its last tag go its builds.
func (h *Handler) deleteCustomTemplate(r *http.Request, c Caller, ref string) error {
	if err := h.templatesOn(); err != nil {
		return err
	}
	name, tag, err := template.ParseRef(ref)
	if err != nil {
		return fmt.Errorf("template '%s' not found: %w", errdefs.ClipN(ref, 64), errdefs.ErrNotFound)
	}
	owner, err := h.o.Catalog.OwnerOf(r.Context(), c.template(), name)
	if err != nil {
		return err
	}
	var tags []string // all of them
	if strings.Contains(ref, ":") {
		tags = []string{tag}
	}
	err = h.o.Builder.DeleteTags(r.Context(), owner, name, tags...)
	if errors.Is(err, errdefs.ErrNotFound) {
		return fmt.Errorf("template '%s' not found: %w", errdefs.ClipN(ref, 64), errdefs.ErrNotFound)
	}
	return err
}
