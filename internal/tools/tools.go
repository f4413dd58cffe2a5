// Package tools is Kiln's tool set for language models: the one list of
// tool definitions (names, descriptions, JSON Schemas of the arguments),
// their implementation over the Go SDK (client.Client), the MCP server
// built from them (stdio for `kiln mcp`, streamable HTTP for /mcp on kiln
// serve) and the same definitions in the shapes of OpenAI's and Anthropic's
// function-calling APIs. Every surface calls the same Call, so a tool
// behaves the same whichever way a model reaches it.
package tools

import (
	"fmt"
	"slices"
)

// Tool describes one tool to a model.
type Tool struct {
	Name        string
	Description string
	// Schema is the JSON Schema (an object) of the tool's arguments.
	Schema map[string]any
	// session marks the tools that manage an MCP session's sandbox; they
	// have no meaning in a function-calling loop, where the program owns
	// the sandbox.
	session bool
	// desktop marks the tools that need a desktop sandbox (computer):
	// sets give them only by name (Select); MCP sessions offer them all.
	desktop bool
}

// Languages are the code interpreter's languages (the code-interpreter
// template has all of them).
var Languages = []string{"python", "r", "javascript", "typescript", "bash", "go", "rust", "c", "cpp", "java"}

func str(desc string) map[string]any { return map[string]any{"type": "string", "description": desc} }

func num(desc string) map[string]any { return map[string]any{"type": "number", "description": desc} }

func object(props map[string]any, required ...string) map[string]any {
	if required == nil {
		required = []string{}
	}
	return map[string]any{"type": "object", "properties": props, "required": required, "additionalProperties": false}
}

const timeoutDesc = "Seconds after which the run is interrupted (default 60, at most 600)."

// tools is the one list of definitions, in the order models see them.
var tools = []Tool{
	{
		Name: "execute_python",
		Description: "Execute Python code in a Jupyter-like interpreter inside an isolated sandbox and return " +
			"its output. Variables, imports and functions persist between calls, so you can build on " +
			"earlier results. The value of the last expression is returned, print() output as stdout; " +
			"matplotlib figures are returned as PNG images without plt.show(). pandas, numpy, scipy and " +
			"matplotlib are installed. An exception returns its traceback as an error.",
		Schema: object(map[string]any{
			"code":    str("The Python code to run."),
			"timeout": num(timeoutDesc),
		}, "code"),
	},
	{
		Name: "run_code",
		Description: "Run code in a persistent interpreter inside an isolated sandbox: " +
			"python (Jupyter), r, javascript (Node), bash, or compile and run go, rust, c, cpp, java. " +
			"State persists between calls in the same language (or context_id). Returns stdout, " +
			"stderr, the value of the last expression, and charts as images; an exception returns its " +
			"traceback as an error.",
		Schema: object(map[string]any{
			"code":       str("The code to run."),
			"language":   map[string]any{"type": "string", "enum": Languages, "description": "The language (default python)."},
			"context_id": str("Run in this interpreter context (from the API's POST .../contexts) instead of the language's default one."),
			"timeout":    num(timeoutDesc),
		}, "code"),
	},
	{
		Name: "run_command",
		Description: "Run a shell command (bash -lc) in the sandbox, e.g. to install a package, run a " +
			"program or inspect files. Returns stdout, stderr and the exit code; a non-zero exit is an " +
			"error. Each command starts a new shell: cd and variables do not carry over.",
		Schema: object(map[string]any{
			"command": str("The shell command line."),
			"cwd":     str("Working directory (default the user's home)."),
			"timeout": num(timeoutDesc),
		}, "command"),
	},
	{
		Name:        "read_file",
		Description: "Read a file in the sandbox. Text is returned as text, PNG/JPEG/GIF/WebP images as images; at most 1 MiB.",
		Schema:      object(map[string]any{"path": str("Path of the file; relative paths start at the user's home.")}, "path"),
	},
	{
		Name:        "write_file",
		Description: "Write a text file in the sandbox, creating parent directories and replacing any file there.",
		Schema: object(map[string]any{
			"path":    str("Path of the file; relative paths start at the user's home."),
			"content": str("The file's new content."),
		}, "path", "content"),
	},
	{
		Name:        "list_files",
		Description: "List a directory in the sandbox: one line per entry with its type, size and path.",
		Schema:      object(map[string]any{"path": str("The directory (default the user's home).")}),
	},
	computerTool,
	{
		Name: "create_sandbox",
		Description: "Start a fresh sandbox for this session, replacing (and killing) the current one and " +
			"losing its state. Not needed before other tools: the session's sandbox starts on first use.",
		Schema:  object(map[string]any{"template": str("Template of the new sandbox (default the session's, usually code-interpreter).")}),
		session: true,
	},
	{
		Name:        "kill_sandbox",
		Description: "Kill this session's sandbox and lose its state; the next tool call starts a new one.",
		Schema:      object(map[string]any{}),
		session:     true,
	},
}

// All returns every tool, as an MCP session offers them.
func All() []Tool { return slices.Clone(tools) }

// ForSandbox returns the tools that act on one sandbox, for
// function-calling loops whose program owns the sandbox.
func ForSandbox() []Tool {
	return slices.DeleteFunc(All(), func(t Tool) bool { return t.session })
}

// Lookup returns the tool named name.
func Lookup(name string) (Tool, bool) {
	i := slices.IndexFunc(tools, func(t Tool) bool { return t.Name == name })
	if i < 0 {
		return Tool{}, false
	}
	return tools[i], true
}

// Select returns the tools of set named in names, in set's order; nil or
// empty names select all of set but the desktop tools (computer), which
// a loop asks for by name. An unknown name is an error.
func Select(set []Tool, names []string) ([]Tool, error) {
	if len(names) == 0 {
		return slices.DeleteFunc(slices.Clone(set), func(t Tool) bool { return t.desktop }), nil
	}
	for _, n := range names {
		if !slices.ContainsFunc(set, func(t Tool) bool { return t.Name == n }) {
			return nil, fmt.Errorf("no tool named %q", n)
		}
	}
	return slices.DeleteFunc(slices.Clone(set), func(t Tool) bool { return !slices.Contains(names, t.Name) }), nil
}
