package server

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/kiln-sh/kiln/internal/cluster"
	"github.com/kiln-sh/kiln/internal/edge"
	"github.com/kiln-sh/kiln/internal/errdefs"
)

// frontE2BTemplate sends a request of E2B's template-build flow to the
// node that builds the template: a new build (POST /v3/templates) to the
// node of the template's last build (where its cached layers are), or any
// live node for a new template; the build's steps, status and uploads
// (e2b.TemplateOfPath) to the node of that build, or of the template's
// last build. That node keeps what the flow leaves between requests (the
// pending build, the uploaded files, the logs) and signs its upload URLs.
func (s *Server) frontE2BTemplate(w http.ResponseWriter, r *http.Request, tmpl, build string) error {
	var owner string
	if r.Method == http.MethodPut { // an upload: signed for the owner it names
		owner = r.URL.Query().Get("owner")
	} else {
		k, err := s.edge.Authenticate(r, edge.AnyKey)
		if err != nil {
			return err
		}
		owner = k.Key.ID
	}
	if build == "" && tmpl == "" { // POST /v3/templates: the name is in the body
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxJSONBytes))
		if err != nil {
			return fmt.Errorf("reading the request: %w", errdefs.ErrInvalidArgument)
		}
		var req struct{ Name, Alias string }
		_ = json.Unmarshal(body, &req)
		tmpl, _, _ = strings.Cut(cmp.Or(req.Name, req.Alias), ":")
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	node := ""
	if build != "" {
		if b, err := s.front.catalog.Store.GetBuild(r.Context(), build); err == nil {
			node = b.Node
		}
	}
	if node == "" && tmpl != "" && owner != "" {
		if bs, err := s.front.catalog.Store.ListBuilds(r.Context(), owner, tmpl, 1); err == nil && len(bs) > 0 {
			node = bs[0].Node
		}
	}
	if node != "" {
		if n, err := s.front.dir.Node(r.Context(), node); err == nil && n.State == cluster.NodeLive {
			// The Host stays the client's: upload URLs are made from it.
			s.front.proxy.ForwardHost(w, r, n, s.e2bProblem)
			return nil
		}
	}
	return s.toAnyNode(w, r, s.e2bProblem)
}
