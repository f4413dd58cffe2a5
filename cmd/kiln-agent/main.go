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
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kiln-sh/kiln/internal/agent"
	"github.com/kiln-sh/kiln/internal/agent/sudo"
)

// shutdownGrace is how long processes get between SIGTERM and SIGKILL
// when the agent is told to stop.
const shutdownGrace = 2 * time.Second

func main() {
	if filepath.Base(os.Args[0]) == sudo.Name {
		// The sandbox's sudo: the host links bin/sudo to this binary.
		os.Exit(sudo.Main(os.Args[1:]))
	}
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
	cfg.PathDir = sudoDir()
	if os.Getpid() == 1 {
		cfg.SudoSocket = sudo.SocketPath
		cfg.HostsFile = "/etc/hosts"
	}
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

	if cfg.SudoSocket != "" && cfg.PathDir != "" {
		if _, err := sudo.Link(sudo.LinkDir, filepath.Join(cfg.PathDir, sudo.Name)); err != nil {
			log.Warn("linking sudo into "+sudo.LinkDir, "err", err)
		}
	}
	srv := agent.New(cfg, log)
	go func() {
		if err := srv.ServeSudo(ctx); err != nil {
			log.Warn("sudo broker stopped", "err", err)
		}
	}()
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

// sudoDir is the dir of the sudo client next to this binary (the host
// links <agent dir>/bin/sudo to it), or "" if there is none.
func sudoDir() string {
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	dir := filepath.Join(filepath.Dir(exe), "bin")
	if _, err := os.Stat(filepath.Join(dir, sudo.Name)); err != nil {
		return ""
	}
	return dir
}
