package tools

import (
	"fmt"
	"strings"
)

// Formats are the shapes Definitions can give tool definitions in.
var Formats = []string{"openai", "anthropic", "mcp"}

type openAITool struct {
	Type     string         `json:"type"` // "function"
	Function openAIFunction `json:"function"`
}

type openAIFunction struct {
	Name        string         `json:"name"`
	Description string         `json:"description"`
	Parameters  map[string]any `json:"parameters"`
}

type anthropicTool struct {
	Name        string         `json:"name"`
	Description string         `json:"description"`
	InputSchema map[string]any `json:"input_schema"`
}

type mcpTool struct {
	Name        string         `json:"name"`
	Description string         `json:"description"`
	InputSchema map[string]any `json:"inputSchema"`
}

// Definitions returns set in the shape of one function-calling API, ready
// to be the "tools" field of a request:
//
//	openai     Chat Completions: [{"type":"function","function":{"name","description","parameters"}}]
//	anthropic  Messages: [{"name","description","input_schema"}]
//	mcp        MCP tools/list: [{"name","description","inputSchema"}]
func Definitions(set []Tool, format string) ([]any, error) {
	out := make([]any, 0, len(set))
	for _, t := range set {
		switch strings.ToLower(format) {
		case "openai":
			out = append(out, openAITool{"function", openAIFunction{t.Name, t.Description, t.Schema}})
		case "anthropic":
			out = append(out, anthropicTool{t.Name, t.Description, t.Schema})
		case "mcp":
			out = append(out, mcpTool{t.Name, t.Description, t.Schema})
		default:
			return nil, fmt.Errorf("unknown tool format %q: want one of %s", format, strings.Join(Formats, ", "))
		}
	}
	return out, nil
}
