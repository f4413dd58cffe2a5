package agent

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
)

// sandboxIDVar names the sandbox's id in the environment of processes and
// kernels: the one KILN_* variable they see.
const sandboxIDVar = "KILN_SANDBOX_ID"

// identify takes on the identity the host gives a restored agent: its
// sandbox id and environment replace the ones of the sandbox that was
// checkpointed, for processes and contexts started from now on. Then
// p.Then is queued in its language's default context.
func (s *Server) identify(ctx context.Context, p wire.IdentifyParams) error {
	if p.SandboxID == "" || strings.ContainsAny(p.SandboxID, "=\x00") {
		return &api.Error{Code: api.CodeInvalidArgument, Message: "identify: invalid sandbox id"}
	}
	env := make([]string, 0, len(p.Env))
	for k, v := range p.Env {
		if k == "" || strings.HasPrefix(k, "KILN_") || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return &api.Error{Code: api.CodeInvalidArgument, Message: "identify: invalid environment variable " + k}
		}
		env = append(env, k+"="+v)
	}
	slices.Sort(env)
	s.idMu.Lock()
	old := s.sandboxID
	s.sandboxID, s.env = p.SandboxID, env
	s.idMu.Unlock()
	s.procs.SetBaseEnv(s.baseEnv())
	if err := renameHosts(s.cfg.HostsFile); err != nil {
		s.log.Warn("renaming the hostname in the hosts file", "err", err)
	}
	if old != p.SandboxID {
		s.log.Info("agent now serves another sandbox", "was", old, "sandbox_id", p.SandboxID)
	}
	if p.Then == nil {
		return nil
	}
	if p.Then.TimeoutMs < 0 {
		return &api.Error{Code: api.CodeInvalidArgument, Message: "identify: timeout must not be negative"}
	}
	c, err := s.defaultContext(p.Then.Language)
	if err != nil {
		return err
	}
	ran := make(chan error, 1)
	err = s.contexts.Queue(ctx, c.ID, p.Then.Code, time.Duration(p.Then.TimeoutMs)*time.Millisecond, func(err error) {
		if err != nil && !p.Wait {
			s.log.Warn("the code identify queued failed", "sandbox_id", p.SandboxID, "language", c.Language, "err", err)
		}
		ran <- err
	})
	if err != nil || !p.Wait {
		return err
	}
	select {
	case err := <-ran:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// baseEnv is what processes and kernels inherit: the sandbox's
// environment and its id.
func (s *Server) baseEnv() []string {
	s.idMu.Lock()
	defer s.idMu.Unlock()
	env := slices.Clone(s.env)
	if s.sandboxID != "" {
		env = append(env, sandboxIDVar+"="+s.sandboxID)
	}
	return env
}
