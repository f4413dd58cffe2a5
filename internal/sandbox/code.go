package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/channel"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/errdefs"
)

// CreateContext starts a code context (a persistent interpreter).
func (a *Agent) CreateContext(ctx context.Context, p wire.ContextParams) (api.Context, error) {
	var c api.Context
	return c, a.invoke(ctx, wire.MethodContextCreate, p, &c)
}

// Contexts lists the sandbox's code contexts.
func (a *Agent) Contexts(ctx context.Context) ([]api.Context, error) {
	var cs []api.Context
	return cs, a.invoke(ctx, wire.MethodContexts, struct{}{}, &cs)
}

// ContextsWithDefaults lists the sandbox's code contexts including the
// default contexts of languages, registered first if need be.
func (a *Agent) ContextsWithDefaults(ctx context.Context, languages ...string) ([]api.Context, error) {
	var cs []api.Context
	return cs, a.invoke(ctx, wire.MethodContexts, wire.ContextsParams{Defaults: languages}, &cs)
}

// RestartContext replaces a context's interpreter with a fresh one.
func (a *Agent) RestartContext(ctx context.Context, id string) (api.Context, error) {
	var c api.Context
	return c, a.invoke(ctx, wire.MethodContextRestart, wire.ContextIDParams{ID: id}, &c)
}

// DeleteContext stops and forgets a context.
func (a *Agent) DeleteContext(ctx context.Context, id string) error {
	return a.invoke(ctx, wire.MethodContextDelete, wire.ContextIDParams{ID: id}, nil)
}

// maxExecuteParams bounds the encoded ExecuteParams: one channel call,
// less room for the call's envelope.
const maxExecuteParams = channel.MaxCall - 1024

// Execute runs code in a context and streams its events (stdout, stderr,
// result, execution_error, done) to emit until the execution ends, ctx is
// done (the agent then interrupts the code; the context survives) or emit
// fails. It returns the execution count.
func (a *Agent) Execute(ctx context.Context, p wire.ExecuteParams, emit func(api.Event) error) (count int, err error) {
	// Say so plainly when the call is too big rather than fail inside the
	// channel.
	if b, err := json.Marshal(p); err == nil && len(b) > maxExecuteParams {
		return 0, fmt.Errorf("code and env of %d bytes (JSON-encoded) exceed the agent call limit of %d bytes: %w", len(b), maxExecuteParams, errdefs.ErrInvalidArgument)
	}
	st, err := a.conn.Call(ctx, wire.MethodExecute, p)
	if err != nil {
		return 0, agentError(err)
	}
	defer st.Close()
	for {
		f, err := st.Recv(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return 0, agentError(err)
		}
		var ev api.Event
		if err := json.Unmarshal(f.Payload, &ev); err != nil {
			return 0, fmt.Errorf("decoding agent event: %w", err)
		}
		if ev.Type == api.EventDone {
			count = ev.ExecutionCount
		}
		if err := emit(ev); err != nil {
			return 0, err
		}
	}
	// The call's result may repeat the count; the done event is what
	// counts, the result only fills in when there was none.
	var res json.RawMessage
	if err := st.Wait(ctx, &res); err != nil {
		return 0, agentError(err)
	}
	if count == 0 && len(res) > 0 {
		var n int
		var obj struct {
			ExecutionCount int `json:"execution_count"`
		}
		if json.Unmarshal(res, &n) == nil {
			count = n
		} else if json.Unmarshal(res, &obj) == nil {
			count = obj.ExecutionCount
		}
	}
	return count, nil
}
