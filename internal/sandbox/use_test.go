package sandbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// Use is the one way every front end gets a sandbox to work in: owner
// checked, auto-resumed when paused with auto-resume, running, with its
// agent.
func TestUse(t *testing.T) {
	requireRunsc(t)
	cfg := testConfig(t)
	m := newManager(t, cfg)
	ctx := context.Background()
	auto := create(t, m, sandbox.CreateOptions{Runtime: "runsc", Owner: "alice", AutoResume: true})
	plain := create(t, m, sandbox.CreateOptions{Runtime: "runsc", Owner: "alice"})
	auto.Sh("echo kept > /home/user/x")
	for _, id := range []sandbox.ID{auto.SB.ID, plain.SB.ID} {
		if _, err := m.Pause(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	gone := create(t, m, sandbox.CreateOptions{Runtime: "runsc", Owner: "alice"})
	if err := m.Kill(ctx, gone.SB.ID); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name    string
		id      sandbox.ID
		owner   string
		granted bool
		want    error
		state   sandbox.State
	}{
		{"another tenant's", auto.SB.ID, "bob", false, errdefs.ErrNotFound, ""},
		{"unknown", sandbox.NewID(), "alice", false, errdefs.ErrNotFound, ""},
		{"paused without auto-resume", plain.SB.ID, "alice", false, errdefs.ErrFailedPrecondition, sandbox.StatePaused},
		{"granted by its own token, paused without auto-resume", plain.SB.ID, "", true, errdefs.ErrFailedPrecondition, sandbox.StatePaused},
		{"killed", gone.SB.ID, "alice", false, errdefs.ErrFailedPrecondition, sandbox.StateStopped},
		{"paused with auto-resume: woken", auto.SB.ID, "alice", false, nil, sandbox.StateRunning},
		{"granted by its own token", auto.SB.ID, "", true, nil, sandbox.StateRunning},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var sb sandbox.Sandbox
			var a *sandbox.Agent
			var err error
			if tt.granted {
				sb, a, err = m.UseGranted(ctx, tt.id)
			} else {
				sb, a, err = m.Use(ctx, tt.id, tt.owner)
			}
			if tt.want != nil {
				if !errors.Is(err, tt.want) || a != nil {
					t.Fatalf("Use: %v (agent %v), want %v", err, a != nil, tt.want)
				}
			} else if err != nil || a == nil {
				t.Fatalf("Use: %v", err)
			}
			if tt.state != "" && sb.State != tt.state {
				t.Errorf("state %s, want %s", sb.State, tt.state)
			}
		})
	}
	auto.Agent, _ = m.Agent(auto.SB.ID)
	if r := auto.Sh("cat /home/user/x"); r.Stdout != "kept\n" {
		t.Errorf("woken sandbox's file: %q", r.Stdout)
	}
}
