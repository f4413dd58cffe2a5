package server

import (
	"net/http"

	"github.com/kiln-sh/kiln/api"
)

// pushTemplate pushes the build a template ref means to the caller to a
// registry as an OCI image. It answers when the push is done: a large
// template takes as long as its layers take to compress and upload.
func (s *Server) pushTemplate(w http.ResponseWriter, r *http.Request) error {
	if err := s.templatesOn(); err != nil {
		return err
	}
	var req api.TemplatePushRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	if req.Image == "" {
		return invalid("image is required: the [registry/]repository[:tag] to push to")
	}
	t, err := s.catalog.Resolve(r.Context(), caller(r).ID, r.PathValue("ref"))
	if err != nil {
		return err
	}
	digest, err := s.builder.Push(r.Context(), t, req.Image, req.Registry)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, api.TemplatePushResult{Image: req.Image, Digest: digest, BuildID: t.Build})
}
