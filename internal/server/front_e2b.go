package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/cluster"
	"github.com/kiln-sh/kiln/internal/e2b"
	"github.com/kiln-sh/kiln/internal/edge"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/proxy"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// frontE2B routes E2B's API on a front, in E2B's error shapes: its data
// plane (routing headers, or a <port>-<id>.<domain> host, turned into
// headers so that the node need not share the front's domain) and its
// control-plane routes about one sandbox go to the sandbox's node; its
// creates are placed as native ones are; the rest goes to any live node.
// Everything else is next's.
func (s *Server) frontE2B(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !e2b.Routed(r) {
			if e2b.UnderDomain(r.Host, s.front.domain) {
				e2b.WriteBadHost(w, r, s.front.domain)
				return
			}
			next.ServeHTTP(w, r)
			return
		}
		defer s.recover(w, r)
		if id, port, ok := e2b.Target(r); ok {
			s.frontE2BData(w, r, id, port)
			return
		}
		if err := s.frontE2BControl(w, r); err != nil {
			e2b.WriteProblem(w, r, s.edge, err)
		}
	})
}

// frontE2BData proxies a data-plane request to the node of sandbox id;
// the node checks the access token. A sandbox that is not running, or
// whose node is lost or does not answer, is E2B's 502; a catalog that is
// down is a 503 (the sandbox may be fine).
func (s *Server) frontE2BData(w http.ResponseWriter, r *http.Request, rawID string, port int) {
	r.Pattern = "E2B data plane (front)"
	edge.StreamBody(r)
	id, err := sandbox.ParseID(rawID)
	if err != nil {
		e2b.WriteGone(w, errdefs.ClipN(rawID, 40))
		return
	}
	edge.Annotate(r, rawID)
	// The node checks credentials; requests that carry none at all are
	// held to this front's cap on anonymous requests (before they cost a
	// catalog read), as public routes are on a node.
	if !carriesCredential(r) {
		if err := s.edge.Admit(r, false); err != nil {
			w.Header().Set("Connection", "close")
			e2b.WriteProblem(w, r, s.edge, err)
			return
		}
	}
	// A sandbox routed before, on a serving node: no catalog read (the
	// node answers for one that ended since).
	n, err := s.routedNode(r.Context(), id)
	if err != nil {
		sb, err := s.front.store.GetSandbox(r.Context(), id)
		if errors.Is(err, errdefs.ErrUnavailable) { // the catalog is down: the sandbox may be fine
			e2b.WriteProblem(w, r, s.edge, err)
			return
		}
		if err != nil || sb.State.Terminal() {
			e2b.WriteGone(w, rawID)
			return
		}
		n, err = s.front.dir.Node(r.Context(), sb.Node)
		if errors.Is(err, errdefs.ErrUnavailable) {
			e2b.WriteProblem(w, r, s.edge, err)
			return
		}
		if err != nil || s.front.dir.Answering(n) != nil {
			e2b.WriteGone(w, rawID)
			return
		}
		s.front.routes.put(sb.ID, route{owner: sb.Owner, node: sb.Node, started: n.StartedAt})
	}
	e2b.RouteByHeaders(r, rawID, port)
	// The Host stays the client's: an exposed port's server sees it.
	s.front.proxy.ForwardHost(w, r, n, func(w http.ResponseWriter, _ *http.Request, _ error) { e2b.WriteGone(w, rawID) })
}

// carriesCredential reports whether a data-plane request carries anything
// that may be a credential: a token, an API key or a URL signature.
func carriesCredential(r *http.Request) bool {
	for _, h := range []string{"X-Access-Token", proxy.HeaderTrafficToken, "X-Api-Key", "Authorization"} {
		if r.Header.Get(h) != "" {
			return true
		}
	}
	return r.URL.Query().Get("signature") != ""
}

// frontE2BControl serves E2B's control plane on a front.
func (s *Server) frontE2BControl(w http.ResponseWriter, r *http.Request) error {
	if e2b.IsCreate(r) {
		k, err := s.edge.Authenticate(r, edge.AnyKey)
		if err != nil {
			return err
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxJSONBytes))
		if err != nil {
			return fmt.Errorf("reading the request: %w", errdefs.ErrInvalidArgument)
		}
		// Only where it may go is read here; the node validates it. An
		// E2B template id may also name a snapshot.
		var req struct {
			TemplateID   string `json:"templateID"`
			VolumeMounts []struct {
				Name string `json:"name"`
			} `json:"volumeMounts"`
		}
		_ = json.Unmarshal(body, &req)
		var vols []api.VolumeMount
		for _, m := range req.VolumeMounts {
			vols = append(vols, api.VolumeMount{Volume: m.Name})
		}
		want, err := s.frontWant(r.Context(), k.Key.ID, "", req.TemplateID, req.TemplateID, vols)
		if err != nil {
			return err
		}
		if want.Node == "" { // not a snapshot's or a custom template's node
			want.Pool = cluster.PoolName(e2b.KilnTemplate(req.TemplateID))
		}
		return s.place(w, r, body, want, s.reservation(k.Key, 0))
	}
	if id, content, ok := e2b.VolumeOfPath(r.URL.Path); ok {
		edge.StreamBody(r)
		return s.frontE2BVolume(w, r, id, content)
	}
	if ok, err := s.frontE2BTemplates(w, r); ok {
		return err
	}
	if e2b.SignedFiles(r) {
		edge.StreamBody(r)
		return s.frontSignedFiles(w, r)
	}
	raw, ok := e2b.SandboxOfPath(r.URL.Path)
	if !ok {
		edge.StreamBody(r)
		return s.toAnyNode(w, r, s.e2bProblem)
	}
	k, err := s.edge.Authenticate(r, edge.AnyKey)
	if err != nil {
		return err
	}
	edge.Annotate(r, raw)
	// As E2B's own lookup: another key's, an ended or an unknown sandbox
	// is not found.
	notFound := fmt.Errorf("sandbox \"%s\" not found: %w", errdefs.ClipN(raw, 40), errdefs.ErrNotFound)
	id, err := sandbox.ParseID(raw)
	if err != nil {
		return notFound
	}
	sb, err := s.front.store.GetSandbox(r.Context(), id)
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		return notFound
	case err != nil:
		return fmt.Errorf("looking up sandbox: %w", err)
	case sb.Owner != k.Key.ID || sb.State.Terminal():
		return notFound
	}
	n, err := s.liveNodeOf(r.Context(), sb) // front_move.go
	if err != nil {
		return err
	}
	s.front.proxy.Forward(w, r, n, s.e2bProblem)
	return nil
}

// e2bProblem answers err in E2B's error shape.
func (s *Server) e2bProblem(w http.ResponseWriter, r *http.Request, err error) {
	e2b.WriteProblem(w, r, s.edge, err)
}

// frontE2BVolume proxies E2B's requests about one volume to its node: the
// owner's (API key) by id or name, the content API's (the volume's token,
// which only that node can check) by id.
func (s *Server) frontE2BVolume(w http.ResponseWriter, r *http.Request, id string, content bool) error {
	if !content {
		if _, err := s.edge.Authenticate(r, edge.AnyKey); err != nil {
			return err
		}
		return s.toVolumeNode(w, r, id, s.e2bProblem)
	}
	v, err := s.front.volumes.GetVolume(r.Context(), id)
	if err != nil {
		return s.toAnyNode(w, r, s.e2bProblem) // it answers for an unknown volume
	}
	return s.toNodeOf(w, r, v, s.e2bProblem)
}
