package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kiln-sh/kiln/internal/agentapi/channel"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/errdefs"
)

// identifyTimeout bounds the identify call to a restored agent.
const identifyTimeout = 10 * time.Second

// identify gives the agent of a sandbox restored from a checkpoint (a
// fork, a snapshot, a warm template or pool) the identity of rec: its id
// (KILN_SANDBOX_ID) and environment. Without it the restored agent keeps
// the ones of the sandbox that was checkpointed, in memory. Call it on the
// restored sandbox's first session, before the sandbox is served.
//
// An agent too old to know the call (a checkpoint from an earlier kiln)
// answers invalid_argument; that is logged and tolerated, the sandbox then
// keeps the checkpoint's environment.
//
// then, if not nil, is code the agent runs next in its language's default
// context (see warmKernelCode); with wait the call returns once it ran,
// else at once (it still runs before anything sent afterwards).
func (m *Manager) identify(ctx context.Context, conn *channel.Conn, rec Sandbox, then *wire.ExecuteParams, wait bool) error {
	ctx, cancel := context.WithTimeout(ctx, identifyTimeout)
	defer cancel()
	a := &Agent{conn: conn}
	err := a.Identify(ctx, wire.IdentifyParams{SandboxID: rec.ID.String(), Env: rec.Env, Then: then, Wait: wait && then != nil})
	if errors.Is(err, errdefs.ErrInvalidArgument) {
		m.log.Warn("restored agent does not take a new identity; it keeps the checkpoint's environment",
			"sandbox_id", rec.ID, "agent", conn.Agent().Agent, "err", err)
		return nil
	}
	if err != nil {
		return fmt.Errorf("giving the restored agent its identity: %w", err)
	}
	return nil
}
