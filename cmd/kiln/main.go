// Command kiln is Kiln's one binary: the server, the CLI and the tools.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/kiln-sh/kiln/internal/config"
)

const usage = `kiln: self-hosted sandboxes for AI agents

Usage:
  kiln serve [flags]                     serve the REST API (KILN_LISTEN, KILN_STORE)
  kiln run [flags] -- COMMAND [ARG...]   run a command in a fresh sandbox, then destroy it
  kiln run [flags] SCRIPT                run a script file (.py, .sh, ...) the same way
  kiln run --lang LANG FILE              run code in a fresh code-interpreter sandbox
  kiln template build -t NAME [-f DOCKERFILE] CONTEXT_DIR
                                         build a template on a server from a Dockerfile
  kiln template ls|get|rm|tag|logs|...   manage a server's templates (kiln template -h)
  kiln template build [NAME...]          build the built-in templates here (default: all)
  kiln bench [flags]                     measure sandbox latency and memory (docs/benchmarks.md)
  kiln sandbox create|ls|exec|code|...   manage a server's sandboxes (kiln sandbox -h)
  kiln files ls|get|put|rm|...           move files in and out of a server's sandbox
  kiln snapshot ls|get|rm                list and delete a server's snapshots
  kiln volume create|ls|rm               persistent volumes that sandboxes mount
  kiln keys create|ls|revoke             manage a server's API keys (admin key)
  kiln mcp [flags]                       serve Kiln's tools to an MCP client over stdio
  kiln tools [--format openai|anthropic] print tool definitions for function-calling APIs
  kiln version                           print the version

Run 'kiln COMMAND -h' for a command's flags. Environment: KILN_DATA_DIR
(default /var/lib/kiln), KILN_RUNTIME (runsc or runc), KILN_AGENT; for
the sandbox, files, snapshot, template and keys commands KILN_URL (default
http://127.0.0.1:8420) and KILN_API_KEY.
`

// version is set by the build (-ldflags "-X main.version=...").
var version = "dev"

// exitError carries a process exit code out of a subcommand.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	var ee exitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		os.Exit(ee.code)
	default:
		fmt.Fprintln(os.Stderr, "kiln:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return exitError{2}
	}
	cfg := config.FromEnv()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	switch args[0] {
	case "serve":
		return serveCmd(ctx, cfg, args[1:])
	case "run":
		return runCmd(ctx, cfg, log, args[1:])
	case "bench":
		return benchCmd(ctx, cfg, log, args[1:])
	case "template":
		return templateCmd(ctx, cfg, args[1:])
	case "sandbox":
		return sandboxCmd(ctx, args[1:])
	case "files":
		return filesCmd(ctx, args[1:])
	case "snapshot", "snapshots":
		return snapshotCmd(ctx, args[1:])
	case "volume", "volumes":
		return volumeCmd(ctx, args[1:])
	case "keys":
		return keysCmd(ctx, args[1:])
	case "mcp":
		return mcpCmd(ctx, args[1:])
	case "tools":
		return toolsCmd(args[1:])
	case "version", "--version":
		fmt.Println("kiln", version)
		return nil
	case "help", "-h", "--help":
		fmt.Print(usage)
		return nil
	}
	fmt.Fprintf(os.Stderr, "kiln: unknown command %q\n\n%s", args[0], usage)
	return exitError{2}
}
