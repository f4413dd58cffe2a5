// Command kiln-agent runs inside every sandbox as PID 1: it reaps
// zombies, and serves the host's calls (processes, files) on the channel
// carried by its stdin and stdout. Logs go to stderr; stdout is the
// channel. Configuration comes from KILN_* environment variables (see
// agent.Config). Build it static: CGO_ENABLED=0.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kiln-sh/kiln/internal/agent"
)

// shutdownGrace is how long processes get between SIGTERM and SIGKILL
// when the agent is told to stop.
const shutdownGrace = 2 * time.Second

func main() {
	version := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *version {
		fmt.Println("kiln-agent", agent.Version)
		return
	}
	cfg, err := agent.ConfigFromEnv(os.Environ())
	if err != nil {
		fmt.Fprintln(os.Stderr, "kiln-agent: reading configuration:", err)
		os.Exit(2)
	}
	cfg.ReapAll = true
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.LogLevel})).
		With("component", "agent", "sandbox_id", cfg.SandboxID)
	if err := run(log, cfg); err != nil {
		log.Error("agent stopped", "err", err)
		os.Exit(1)
	}
}

func run(log *slog.Logger, cfg agent.Config) error {
	if os.Getpid() != 1 {
		// Not init (e.g. under test): become the subreaper of our
		// descendants so that orphans are re-parented to us and reaped,
		// as they would be by PID 1.
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			log.Warn("becoming child subreaper", "err", err)
		}
	}
	// Every catchable signal is caught: as PID 1 none stops the agent (see
	// handleSignals); otherwise SIGTERM and SIGINT stop it gracefully.
	ctx, stop := handleSignals(log, os.Getpid() == 1)
	defer stop()

	srv := agent.New(cfg, log)
	log.Info("agent started", "version", agent.Version, "pid", os.Getpid(),
		"memory_limit", cfg.MemoryLimit, "oom_guard", cfg.OOMGuard)
	err := srv.Serve(ctx, os.Stdin, os.Stdout)

	closeCtx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	_ = srv.Close(closeCtx)
	switch {
	case ctx.Err() != nil:
		log.Info("agent stopped by signal")
		return nil
	case errors.Is(err, io.EOF):
		log.Info("host closed the channel")
		return nil
	}
	return fmt.Errorf("serving channel: %w", err)
}
