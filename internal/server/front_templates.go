package server

import (
	"fmt"
	"net/http"

	"github.com/kiln-sh/kiln/internal/cluster"
	"github.com/kiln-sh/kiln/internal/e2b"
	"github.com/kiln-sh/kiln/internal/edge"
	"github.com/kiln-sh/kiln/internal/errdefs"
)

// A template build reads files uploaded before it (COPY sources, image
// archives; E2B's waiting build and its signed upload links too), and
// they are on the node that took the upload. So a front sends a key's
// uploads and build starts to one node: the live node that ranks first
// for the key by rendezvous hashing, the same on every front while the
// live nodes stay the same. A build's log is on the node that ran it.

// registerFrontTemplates routes the native template routes that must
// meet on one node.
func (s *Server) registerFrontTemplates() {
	s.route("HEAD /v1/templates/files/{hash}", s.frontOwnerNode, 0)
	s.route("PUT /v1/templates/files/{hash}", s.frontOwnerNode, streamBody)
	s.route("POST /v1/templates/builds", s.frontOwnerNode, 0)
	s.route("GET /v1/templates/builds/{id}/logs", s.frontBuildLogs, 0)
}

// frontOwnerNode proxies r to the caller's build node.
func (s *Server) frontOwnerNode(w http.ResponseWriter, r *http.Request) error {
	return s.toOwnerNode(w, r, caller(r).ID, s.writeError)
}

// toOwnerNode proxies r to owner's build node.
func (s *Server) toOwnerNode(w http.ResponseWriter, r *http.Request, owner string, fail cluster.Fail) error {
	ns, err := s.front.dir.Nodes(r.Context())
	if err != nil {
		return err
	}
	n, ok := cluster.Affine(ns, owner)
	if !ok {
		return fmt.Errorf("no live node: %w", errdefs.ErrUnavailable)
	}
	s.front.proxy.Forward(w, r, n, fail)
	return nil
}

// frontBuildLogs proxies a build's log to the node that ran the build,
// which holds the log file; a build the catalog does not know, or whose
// node is not live, goes to any node, which answers for it.
func (s *Server) frontBuildLogs(w http.ResponseWriter, r *http.Request) error {
	return s.toBuildNode(w, r, r.PathValue("id"), s.writeError)
}

// toBuildNode proxies r to the node of build id, or any node.
func (s *Server) toBuildNode(w http.ResponseWriter, r *http.Request, id string, fail cluster.Fail) error {
	rec, err := s.front.catalog.Store.GetBuild(r.Context(), id)
	if err != nil || rec.Node == "" {
		return s.toAnyNode(w, r, fail)
	}
	n, err := s.front.dir.Node(r.Context(), rec.Node)
	if err != nil || !n.Serving() {
		return s.toAnyNode(w, r, fail)
	}
	s.front.proxy.Forward(w, r, n, fail)
	return nil
}

// frontE2BTemplates routes E2B's template routes on a front, as the
// native ones: the build request, its upload links and its start to the
// key's build node, an upload to the build node of the owner its signed
// link names (only the node that signed it can check it), the status
// (with the log) to the build's node, and a template's own route (info,
// change, delete: it removes the build's files there) to the node of its
// last build. ok is false for any other request.
func (s *Server) frontE2BTemplates(w http.ResponseWriter, r *http.Request) (ok bool, err error) {
	route, tmpl, build := e2b.TemplateRouteOf(r)
	if route == e2b.NotTemplate {
		return false, nil
	}
	edge.StreamBody(r)
	if route == e2b.TemplateFilePut {
		// The node checks the signature; a request without one is held
		// to this front's cap on anonymous requests.
		if !carriesCredential(r) {
			if err := s.edge.Admit(r, false); err != nil {
				w.Header().Set("Connection", "close")
				return true, err
			}
		}
		return true, s.toOwnerNode(w, r, r.URL.Query().Get("owner"), s.e2bProblem)
	}
	k, err := s.edge.Authenticate(r, edge.AnyKey)
	if err != nil {
		return true, err
	}
	switch route {
	case e2b.TemplateStatus:
		return true, s.toBuildNode(w, r, build, s.e2bProblem)
	case e2b.TemplateItself:
		bs, err := s.front.catalog.Store.ListBuilds(r.Context(), k.Key.ID, tmpl, 1)
		if err != nil || len(bs) == 0 {
			return true, s.toAnyNode(w, r, s.e2bProblem)
		}
		return true, s.toBuildNode(w, r, bs[0].ID, s.e2bProblem)
	}
	return true, s.toOwnerNode(w, r, k.Key.ID, s.e2bProblem)
}
