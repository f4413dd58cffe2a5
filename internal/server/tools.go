package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"

	"github.com/kiln-sh/kiln/client"
	"github.com/kiln-sh/kiln/internal/edge"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/tools"
)

// maxToolArgs bounds the arguments of one tool call (code up to 1 MiB,
// escaped in JSON).
const maxToolArgs = 8 << 20

// newMCP makes the handler of /mcp: each MCP session calls this server
// (on a cluster node, its cluster's in-process front) in-process with the
// API key that opened it (internal/tools).
func (s *Server) newMCP() *tools.HTTPHandler {
	return tools.NewHTTPHandler(func(r *http.Request) *client.Client {
		secret, _ := edge.Secret(r) // authenticated already
		if s.cluster != nil {
			return s.cluster.inProcessClient(secret)
		}
		return s.inProcessClient(secret)
	}, tools.HTTPOptions{Version: s.version, Log: s.log.With("component", "mcp"), Node: s.node})
}

// serveMCP serves MCP's streamable HTTP transport (POST messages, GET the
// server's event stream, DELETE to end the session). The session is bound
// to the key that opened it: another key gets 403.
func (s *Server) serveMCP(w http.ResponseWriter, r *http.Request) error {
	if r.Header.Get("Authorization") == "" { // X-API-Key: auth.RequireBearerToken reads Bearer only
		secret, err := edge.Secret(r)
		if err != nil {
			return err
		}
		r.Header.Set("Authorization", "Bearer "+secret)
	}
	id := caller(r).ID
	auth.RequireBearerToken(func(context.Context, string, *http.Request) (*auth.TokenInfo, error) {
		return &auth.TokenInfo{UserID: id, Expiration: time.Now().Add(time.Hour)}, nil
	}, nil)(s.mcp).ServeHTTP(w, r)
	return nil
}

// listTools serves the sandbox tools' definitions for a function-calling
// API: GET /v1/tools?format=openai|anthropic|mcp[&names=a,b].
func (s *Server) listTools(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	if err := checkQuery(q, "format", "names"); err != nil {
		return err
	}
	format := q.Get("format")
	if format == "" {
		format = "openai"
	}
	var names []string
	if n := q.Get("names"); n != "" {
		names = strings.Split(n, ",")
	}
	set, err := tools.Select(tools.ForSandbox(), names)
	if err != nil {
		return fmt.Errorf("names: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	defs, err := tools.Definitions(set, format)
	if err != nil {
		return fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
	}
	return writeJSON(w, http.StatusOK, defs)
}

// callTool runs one tool call of a model in a sandbox: the body is the
// call's arguments, the answer the api.ToolResult to hand back to the
// model. Failures inside the call (an exception, a missing file, bad
// arguments) are results with is_error; only a sandbox that cannot be used
// is an HTTP error.
func (s *Server) callTool(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	if !slices.ContainsFunc(tools.ForSandbox(), func(t tools.Tool) bool { return t.Name == name }) {
		return fmt.Errorf("no sandbox tool named %q (see GET /v1/tools): %w", name, errdefs.ErrNotFound)
	}
	if _, err := s.agent(r); err != nil {
		return err
	}
	var args json.RawMessage
	if err := decodeBody(http.MaxBytesReader(w, r.Body, maxToolArgs), &args); err != nil {
		return err
	}
	if bytes.TrimSpace(args)[0] != '{' {
		return invalid("the body must be the call's arguments: a JSON object")
	}
	secret, _ := edge.Secret(r)
	res, err := tools.Call(r.Context(), s.inProcessClient(secret), r.PathValue("id"), name, args, nil)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, res)
}

// CloseMCP ends the MCP sessions and kills their sandboxes (Shutdown does
// too). Call it when shutdown begins: the sessions' event streams would
// otherwise hold http.Server.Shutdown for its whole grace period.
func (s *Server) CloseMCP() { s.mcp.Close() }
