package client

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"

	"github.com/kiln-sh/kiln/api"
)

// Tools returns the definitions of Kiln's sandbox tools (execute_python,
// run_code, run_command, read_file, write_file, list_files) in format:
// "openai" (Chat Completions), "anthropic" (Messages) or "mcp". The answer
// is a JSON array to use as the "tools" field of a model request. names,
// if any, select tools.
func (c *Client) Tools(ctx context.Context, format string, names ...string) (json.RawMessage, error) {
	q := url.Values{"format": {format}}
	if len(names) > 0 {
		q.Set("names", strings.Join(names, ","))
	}
	var out json.RawMessage
	if err := c.call(ctx, http.MethodGet, "/v1/tools", q, nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// CallTool runs a model's call of the tool name, with the arguments the
// model wrote (a JSON object), in sandbox id, and returns what to hand
// back to the model. A failure inside the call (an exception, a non-zero
// exit, bad arguments) is a result with IsError, not an error.
func (c *Client) CallTool(ctx context.Context, id, name string, args json.RawMessage) (*api.ToolResult, error) {
	if len(args) == 0 {
		args = json.RawMessage("{}")
	}
	var out api.ToolResult
	if err := c.call(ctx, http.MethodPost, sandboxPath(id, "tools", url.PathEscape(name)), nil, args, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
