package agent

import (
	"context"

	"github.com/kiln-sh/kiln/internal/agent/process"
	"github.com/kiln-sh/kiln/internal/agent/sudo"
)

// ServeSudo serves the sudo broker (package sudo) on Config.SudoSocket
// until ctx is done; it returns at once if none is configured. Its
// commands start through the process table, like kernels, so the
// reaper, the pids cgroup and the guard see them.
func (s *Server) ServeSudo(ctx context.Context) error {
	if s.cfg.SudoSocket == "" {
		return nil
	}
	b := &sudo.Broker{
		Path:    s.cfg.SudoSocket,
		PathDir: s.cfg.PathDir,
		Start:   s.procs.Spawn,
		Lookup: func(name string) (process.User, error) {
			a, err := lookupAccount(name)
			return a.processUser(), err
		},
		Log: s.log.With("component", "sudo"),
	}
	return b.Serve(ctx)
}
