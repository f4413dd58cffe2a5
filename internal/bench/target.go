package bench

import (
	"context"
	"fmt"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/client"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// Target is what the concurrency and churn runs drive: an in-process
// Manager (kiln bench alone) or a running kiln serve through the Go SDK
// (kiln bench --server URL).
type Target interface {
	// Create makes a sandbox of runtime and runs `true` in it.
	Create(ctx context.Context, runtime string) (id string, err error)
	Kill(ctx context.Context, id string) error
	// List lists the first page of sandboxes (GET /v1/sandboxes on a
	// server), for its latency.
	List(ctx context.Context) error
	String() string
}

// Manager drives sandboxes in this process.
func Manager(m *sandbox.Manager) Target { return managerTarget{m} }

// Server drives a running kiln serve at url with an API key.
func Server(url, key string) Target { return serverTarget{client.New(url, key), url} }

type managerTarget struct{ m *sandbox.Manager }

var _ Target = managerTarget{}

func (t managerTarget) Create(ctx context.Context, rt string) (string, error) {
	sb, err := t.m.Create(ctx, sandbox.CreateOptions{Runtime: rt})
	if err != nil {
		return "", err
	}
	a, err := t.m.Agent(sb.ID)
	if err == nil {
		var exit *api.ExitStatus
		exit, err = a.Exec(ctx, wire.ExecParams{Args: []string{"true"}}, func(api.Event) error { return nil })
		if err == nil && exit.Code != 0 {
			err = fmt.Errorf("true exited %d", exit.Code)
		}
	}
	return sb.ID.String(), err
}

func (t managerTarget) Kill(ctx context.Context, id string) error {
	return t.m.Kill(ctx, sandbox.ID(id))
}

func (t managerTarget) List(ctx context.Context) error {
	_, _, err := t.m.List(ctx, sandbox.Filter{})
	return err
}

func (managerTarget) String() string { return "in-process Manager" }

type serverTarget struct {
	c   *client.Client
	url string
}

var _ Target = serverTarget{}

func (t serverTarget) Create(ctx context.Context, rt string) (string, error) {
	sb, err := t.c.CreateSandbox(ctx, api.CreateSandboxRequest{Runtime: rt, Timeout: 600})
	if err != nil {
		return "", err
	}
	r, err := t.c.Output(ctx, sb.ID, api.CommandRequest{Args: []string{"true"}})
	if err == nil && r.Exit.Code != 0 {
		err = fmt.Errorf("true exited %d", r.Exit.Code)
	}
	return sb.ID, err
}

func (t serverTarget) Kill(ctx context.Context, id string) error { return t.c.KillSandbox(ctx, id) }

func (t serverTarget) List(ctx context.Context) error {
	_, err := t.c.ListSandboxes(ctx, client.ListFilter{})
	return err
}

func (t serverTarget) String() string { return "kiln serve at " + t.url }
