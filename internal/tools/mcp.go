package tools

import (
	"context"
	"encoding/base64"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/kiln-sh/kiln/api"
)

// instructions tell an MCP client's model how the tools fit together.
const instructions = "Kiln runs code in an isolated sandbox that belongs to this session. " +
	"It starts on the first tool call and is reused by every later one, so variables, files and " +
	"installed packages persist until the session ends (then it is killed) or kill_sandbox. " +
	"Use execute_python or run_code for computation and charts, run_command for shell work."

// NewMCPServer returns an MCP server offering every tool on sess. It
// serves one MCP session: when that session ends, sess is closed and its
// sandbox killed.
func NewMCPServer(sess *Session, version string) *mcp.Server {
	// The session's end (stdio EOF, HTTP DELETE or idle expiry) closes
	// sess: attach at initialization, or at the first call for clients of
	// the stateless protocol, which skip it.
	srv := mcp.NewServer(&mcp.Implementation{Name: "kiln", Title: "Kiln sandboxes", Version: version}, &mcp.ServerOptions{
		Instructions:       instructions,
		Capabilities:       &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{}},
		InitializedHandler: func(_ context.Context, req *mcp.InitializedRequest) { sess.attach(req.Session) },
	})
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
