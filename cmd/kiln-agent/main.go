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
	"os/signal"
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
	// SIGTERM/SIGINT stop the agent (and so the sandbox) gracefully.
	ctx, stop := signal.NotifyContext(context.Background(), unix.SIGTERM, unix.SIGINT)
	defer stop()
	// SIGPIPE (a vanished host must not kill us through our stdout) and
	// SIGHUP are caught and dropped. They are handled rather than ignored
	// because an ignored disposition would be inherited by processes.
	dropped := make(chan os.Signal, 4)
	signal.Notify(dropped, unix.SIGPIPE, unix.SIGHUP)
	go func() {
		for sig := range dropped {
			log.Debug("ignoring signal", "signal", sig)
		}
	}()

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
