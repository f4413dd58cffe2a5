package server

import (
	"net/http"

	"github.com/kiln-sh/kiln/internal/cluster"
)

// frontBuildLogs proxies a build's log to the node that ran the build,
// which holds the log file; a build the catalog does not know, or whose
// node is not live, goes to any node, which answers for it.
func (s *Server) frontBuildLogs(w http.ResponseWriter, r *http.Request) error {
	rec, err := s.front.catalog.Store.GetBuild(r.Context(), r.PathValue("id"))
	if err != nil || rec.Node == "" {
		return s.frontAny(w, r)
	}
	n, err := s.front.dir.Node(r.Context(), rec.Node)
	if err != nil || n.State != cluster.NodeLive {
		return s.frontAny(w, r)
	}
	s.front.proxy.Forward(w, r, n, s.writeError)
	return nil
}
