package tools

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/config"
)

// instructions tell an MCP client's model how the tools fit together.
const instructions = "Kiln runs code in an isolated sandbox that belongs to this session. " +
	"It starts on the first tool call and is reused by every later one, so variables, files and " +
	"installed packages persist until the session ends (then it is killed) or kill_sandbox. " +
	"Use execute_python or run_code for computation and charts, run_command for shell work. " +
	"The computer tool drives a desktop (screenshots, mouse, keyboard): it needs a desktop sandbox, " +
	"so call create_sandbox with template \"desktop\" first unless the session's sandbox is one."

// NewMCPServer returns an MCP server offering every tool on sess. It
// serves one MCP session: when that session ends, sess is closed and its
// sandbox killed.
func NewMCPServer(sess *Session, version string) *mcp.Server { return newMCPServer(sess, version, "") }

// newMCPServer is NewMCPServer whose HTTP session ids name node (see
// SessionNode), unless node is "".
func newMCPServer(sess *Session, version, node string) *mcp.Server {
	// The session's end (stdio EOF, HTTP DELETE or idle expiry) closes
	// sess: attach at initialization, or at the first call for clients of
	// the stateless protocol, which skip it.
	o := &mcp.ServerOptions{
		Instructions:       instructions,
		Capabilities:       &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{}},
		InitializedHandler: func(_ context.Context, req *mcp.InitializedRequest) { sess.attach(req.Session) },
	}
	if node != "" {
		o.GetSessionID = func() string { return nodeSessionID(node) }
	}
	srv := mcp.NewServer(&mcp.Implementation{Name: "kiln", Title: "Kiln sandboxes", Version: version}, o)
	for _, t := range All() {
		srv.AddTool(&mcp.Tool{Name: t.Name, Description: t.Description, InputSchema: t.Schema},
			func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				sess.attach(req.Session)
				prog, stop := progress(ctx, req)
				defer stop()
				res, err := sess.Call(ctx, t.Name, req.Params.Arguments, prog)
				if err != nil {
					return nil, err
				}
				return toMCP(res), nil
			})
	}
	return srv
}

// toMCP converts a result to MCP content: images become image content.
func toMCP(res *api.ToolResult) *mcp.CallToolResult {
	out := &mcp.CallToolResult{IsError: res.IsError, Content: []mcp.Content{}}
	for _, c := range res.Content {
		if c.Type == "image" {
			if b, err := base64.StdEncoding.DecodeString(c.Data); err == nil {
				out.Content = append(out.Content, &mcp.ImageContent{Data: b, MIMEType: c.MIMEType})
				continue
			}
		}
		out.Content = append(out.Content, &mcp.TextContent{Text: c.Text})
	}
	return out
}

// An MCP session over HTTP lives in the process that made it. In a
// cluster that is a node, and its session ids name it, <random>.<node>,
// so that every front sends the session's later requests there with no
// state of its own.

// nodeSessionID is a new session id of node: 128 random bits, then the
// node's name.
func nodeSessionID(node string) string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b) + "." + node
}

// SessionNode returns the node named by an MCP session id a node made;
// ok is false for any other id.
func SessionNode(id string) (node string, ok bool) {
	random, node, found := strings.Cut(id, ".")
	if !found || len(random) != 32 || !config.ValidNodeName(node) {
		return "", false
	}
	if _, err := hex.DecodeString(random); err != nil {
		return "", false
	}
	return node, true
}
