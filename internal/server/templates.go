package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/template"
)

// Custom templates (docs/templates.md). Tenancy: a template belongs to
// the key that built it; an admin key sees and manages every key's; a
// public one is visible and usable by every key, but only its owner (or
// an admin) may change or delete it. Another key's private template is
// not found (404), as another key's sandbox is.

// errNoBuilder answers the template routes of a server without a builder.
var errNoBuilder = fmt.Errorf("custom templates are not enabled on this server: %w", errdefs.ErrUnavailable)

// templatesOn checks the server builds templates.
func (s *Server) templatesOn() error {
	if s.builder == nil || s.tmpl == nil || s.catalog == nil {
		return errNoBuilder
	}
	return nil
}

// tmplCaller is the caller as the template catalog's access rules see it.
func tmplCaller(r *http.Request) template.Caller {
	k := caller(r)
	return template.Caller{ID: k.ID, Admin: k.Admin}
}

// listTemplates lists the templates the caller can use: its own (an
// admin: everyone's), the public ones, and the built-ins.
func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request) error {
	if err := checkQuery(r.URL.Query()); err != nil {
		return err
	}
	if err := s.templatesOn(); err != nil {
		return err
	}
	k := caller(r)
	owner := k.ID
	if k.Admin {
		owner = ""
	}
	tags, err := s.tmpl.ListTags(r.Context(), owner, "")
	if err != nil {
		return fmt.Errorf("listing templates: %w", err)
	}
	pub, err := s.tmpl.PublicTags(r.Context(), "")
	if err != nil {
		return fmt.Errorf("listing templates: %w", err)
	}
	out := api.TemplateList{Templates: []api.Template{}}
	seen := map[[3]string]bool{}
	for _, t := range append(tags, pub...) {
		id := [3]string{t.Owner, t.Name, t.Tag}
		if !seen[id] {
			seen[id] = true
			out.Templates = append(out.Templates, tagToAPI(t))
		}
	}
	builtins, err := template.List(s.catalog.DataDir)
	if err != nil {
		return fmt.Errorf("listing built-in templates: %w", err)
	}
	for _, b := range builtins {
		out.Templates = append(out.Templates, api.Template{Name: b.Name, Tag: template.DefaultTag, Public: true, Builtin: true})
	}
	slices.SortStableFunc(out.Templates, func(a, b api.Template) int {
		return strings.Compare(a.Name+":"+a.Tag, b.Name+":"+b.Tag)
	})
	return writeJSON(w, http.StatusOK, out)
}

// getTemplate returns the template {ref} means to the caller, with its
// build.
func (s *Server) getTemplate(w http.ResponseWriter, r *http.Request) error {
	if err := s.templatesOn(); err != nil {
		return err
	}
	name, tag, err := template.ParseRef(r.PathValue("ref"))
	if err != nil {
		return err
	}
	t, err := s.catalog.FindTag(r.Context(), tmplCaller(r), name, tag)
	if errors.Is(err, errdefs.ErrNotFound) && tag == template.DefaultTag && template.Builtin()[name] != nil {
		if _, lerr := template.Lookup(s.catalog.DataDir, name); lerr == nil {
			return writeJSON(w, http.StatusOK, api.Template{Name: name, Tag: tag, Public: true, Builtin: true})
		}
	}
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, s.templateToAPI(r.Context(), t))
}

// templateToAPI is a tag with its build.
func (s *Server) templateToAPI(ctx context.Context, t template.TagRecord) api.Template {
	out := tagToAPI(t)
	if rec, err := s.builder.Get(ctx, t.BuildID); err == nil {
		b := buildToAPI(rec, t.Tag)
		out.Build = &b
	}
	return out
}

func tagToAPI(t template.TagRecord) api.Template {
	return api.Template{Name: t.Name, Tag: t.Tag, BuildID: t.BuildID, Owner: t.Owner, Public: t.Public, UpdatedAt: t.UpdatedAt}
}

// deleteTemplate removes the tag of "name:tag", or every tag of "name",
// and then, if the template has no tag left, its builds and their files
// (running sandboxes keep theirs until they end).
func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request) error {
	if err := s.templatesOn(); err != nil {
		return err
	}
	ref := r.PathValue("ref")
	name, tag, err := template.ParseRef(ref)
	if err != nil {
		return err
	}
	owner, err := s.catalog.OwnerOf(r.Context(), tmplCaller(r), name)
	if err != nil {
		return err
	}
	var tags []string // all of them
	if strings.Contains(ref, ":") {
		tags = []string{tag}
	}
	if err := s.builder.DeleteTags(r.Context(), owner, name, tags...); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// tagTemplate points {name}:{tag} at one of the template's ready builds.
func (s *Server) tagTemplate(w http.ResponseWriter, r *http.Request) error {
	if err := s.templatesOn(); err != nil {
		return err
	}
	name, tag := r.PathValue("name"), r.PathValue("tag")
	if _, _, err := template.ParseRef(name + ":" + tag); err != nil {
		return err
	}
	var req api.TemplateTagRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	rec, err := s.visibleBuild(r, req.BuildID)
	if err != nil {
		return err
	}
	if rec.Template != name {
		return invalid("build %s is a build of template %s, not %s", rec.ID, rec.Template, name)
	}
	if rec.Status != template.BuildReady {
		return fmt.Errorf("build %s is %s, not ready: %w", rec.ID, rec.Status, errdefs.ErrFailedPrecondition)
	}
	others, err := s.tmpl.ListTags(r.Context(), rec.Owner, name)
	if err != nil {
		return fmt.Errorf("listing tags of %s: %w", name, err)
	}
	t := template.TagRecord{Owner: rec.Owner, Name: name, Tag: tag, BuildID: rec.ID, UpdatedAt: time.Now().UTC()}
	t.Public = len(others) > 0 && others[0].Public
	if err := s.tmpl.PutTag(r.Context(), t); err != nil {
		return fmt.Errorf("tagging %s:%s: %w", name, tag, err)
	}
	return writeJSON(w, http.StatusOK, s.templateToAPI(r.Context(), t))
}

// untagTemplate removes {name}:{tag}; the build stays (and can be tagged
// again) until the template is deleted.
func (s *Server) untagTemplate(w http.ResponseWriter, r *http.Request) error {
	if err := s.templatesOn(); err != nil {
		return err
	}
	name, tag := r.PathValue("name"), r.PathValue("tag")
	if _, _, err := template.ParseRef(name + ":" + tag); err != nil {
		return err
	}
	owner, err := s.catalog.OwnerOf(r.Context(), tmplCaller(r), name)
	if err != nil {
		return err
	}
	if err := s.tmpl.DeleteTag(r.Context(), owner, name, tag); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// setTemplatePublic makes every tag of {name} public or private.
func (s *Server) setTemplatePublic(w http.ResponseWriter, r *http.Request) error {
	if err := s.templatesOn(); err != nil {
		return err
	}
	name := r.PathValue("name")
	if _, _, err := template.ParseRef(name); err != nil {
		return err
	}
	var req api.TemplateUpdate
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	if req.Public == nil {
		return invalid("public: required (true or false)")
	}
	owner, err := s.catalog.OwnerOf(r.Context(), tmplCaller(r), name)
	if err != nil {
		return err
	}
	if err := s.tmpl.SetPublic(r.Context(), owner, name, *req.Public); err != nil {
		return err
	}
	tags, err := s.tmpl.ListTags(r.Context(), owner, name)
	if err != nil || len(tags) == 0 {
		return fmt.Errorf("listing tags of %s: %w", name, cmpErr(err, errdefs.ErrNotFound))
	}
	t := tags[0]
	for _, c := range tags {
		if c.Tag == template.DefaultTag {
			t = c
		}
	}
	return writeJSON(w, http.StatusOK, s.templateToAPI(r.Context(), t))
}

// cmpErr is err, or def when err is nil.
func cmpErr(err, def error) error {
	if err != nil {
		return err
	}
	return def
}
