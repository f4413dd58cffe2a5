package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/kiln-sh/kiln/client"
	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/tools"
)

const mcpUsage = `Usage: kiln mcp [flags]

Serves Kiln's tools to an MCP client (Claude Desktop, Claude Code, Cursor,
...) over stdio: execute_python, run_code, run_command, read_file,
write_file, list_files, computer (a desktop's screen, mouse and keyboard:
use --template desktop), create_sandbox, kill_sandbox. The session gets one
sandbox, started on the first tool call and reused by every later one (so
variables and files persist); it is killed when the client disconnects.
Charts come back as images, exceptions as tool errors with the traceback.

The server is --url (KILN_URL, default http://127.0.0.1:8420), the key
--api-key (KILN_API_KEY). kiln serve offers the same tools over streamable
HTTP at /mcp. See docs/llm.md for client configuration.

Flags:
`

func mcpCmd(ctx context.Context, args []string) error {
	env := client.FromEnv()
	fs := flag.NewFlagSet("kiln mcp", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), mcpUsage); fs.PrintDefaults() }
	url := fs.String("url", env.BaseURL(), "Kiln server `URL` (KILN_URL)")
	key := fs.String("api-key", "", "API `key` (default KILN_API_KEY)")
	var o tools.Options
	fs.StringVar(&o.Template, "template", tools.DefaultTemplate, "`template` of the session's sandbox")
	fs.DurationVar(&o.Timeout, "timeout", tools.DefaultTimeout, "the sandbox is killed this long after the last tool call")
	fs.StringVar(&o.Sandbox, "sandbox", "", "use this existing sandbox `id` instead of starting one (it is not killed at the end)")
	debug := fs.Bool("debug", false, "log at debug level (on stderr)")
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 {
		return exitError{2}
	}
	if *key == "" {
		*key = config.Env("KILN_API_KEY")
	}
	if *key == "" {
		return errors.New("no API key: set KILN_API_KEY or pass --api-key")
	}
	level := slog.LevelInfo
	if *debug {
		level = slog.LevelDebug
	}
	// stdout is the protocol's: logs go to stderr, which MCP clients keep.
	o.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("component", "mcp")
	sess := tools.NewSession(client.New(*url, *key), o)
	defer sess.Close()
	err := tools.NewMCPServer(sess, version).Run(ctx, &mcp.StdioTransport{})
	if ctx.Err() != nil {
		return nil // interrupted: a normal end
	}
	return err
}

const toolsUsage = `Usage: kiln tools [--format openai|anthropic|mcp] [--names a,b]

Prints the definitions of Kiln's sandbox tools (execute_python, run_code,
run_command, read_file, write_file, list_files; computer, for desktop
sandboxes, only with --names computer) as the "tools" of a
function-calling request: OpenAI Chat Completions, Anthropic Messages or
MCP. GET /v1/tools serves the same; POST /v1/sandboxes/{id}/tools/{name}
runs a call. See docs/llm.md for the loop.

Flags:
`

func toolsCmd(args []string) error {
	fs := flag.NewFlagSet("kiln tools", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), toolsUsage); fs.PrintDefaults() }
	format := fs.String("format", "openai", "`format`: "+strings.Join(tools.Formats, ", "))
	names := fs.String("names", "", "only these `tools`, comma-separated")
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 {
		return exitError{2}
	}
	var sel []string
	if *names != "" {
		sel = strings.Split(*names, ",")
	}
	set, err := tools.Select(tools.ForSandbox(), sel)
	if err != nil {
		return err
	}
	defs, err := tools.Definitions(set, *format)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(defs)
}
