package server

import (
	"net/http"

	"github.com/kiln-sh/kiln/internal/cluster"
	"github.com/kiln-sh/kiln/internal/tools"
)

// frontMCP routes MCP's streamable HTTP transport (/mcp) on a front: a
// request of a session goes to the node that made it, which its id names
// (tools.SessionNode), so any front serves any session without state of
// its own; a new session (no Mcp-Session-Id) goes to any live node. A
// session whose id names no live node is unknown: 404, as MCP answers a
// session that ended, so that clients start a new one.
func (s *Server) frontMCP(w http.ResponseWriter, r *http.Request) error {
	id := r.Header.Get("Mcp-Session-Id")
	if id == "" {
		return s.toAnyNode(w, r, s.writeError)
	}
	name, ok := tools.SessionNode(id)
	var n cluster.Node
	var err error
	if ok {
		n, err = s.front.dir.Node(r.Context(), name)
	}
	if !ok || err != nil || n.State != cluster.NodeLive {
		http.Error(w, "session not found", http.StatusNotFound)
		return nil
	}
	s.front.proxy.Forward(w, r, n, s.writeError)
	return nil
}
