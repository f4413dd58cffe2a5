package postgres_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/internal/cluster"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/store/postgres/pgtest"
)

// TestCatalogRestart: while the database is down, every kind of query
// (a read, a write, a transaction) is errdefs.ErrUnavailable saying the
// catalog is unavailable, without the database's address; once it is
// back the same Store works again (the pool reconnects), and a node whose
// heartbeat is older than the silence is not marked lost before the
// database has been up for that long (its heartbeats could not be
// written).
func TestCatalogRestart(t *testing.T) {
	pg := pgtest.Private(t)
	s := open(t, pg.URL())
	ctx := t.Context()
	n := cluster.Node{Name: "node-a", URL: "http://node-a:8420", Slots: 4, StartedAt: time.Now()}
	if _, err := s.Heartbeat(ctx, n); err != nil {
		t.Fatal(err)
	}

	pg.Stop(t)
	for name, op := range map[string]func() error{
		"a read":        func() error { _, err := s.Nodes(ctx); return err },
		"a row":         func() error { _, err := s.GetSandbox(ctx, "nosuchsandbox1"); return err },
		"a write":       func() error { return s.DeleteSandbox(ctx, "nosuchsandbox1") },
		"a transaction": func() error { _, err := s.MarkLost(ctx, time.Second); return err },
		"a list": func() error {
			_, _, err := s.ListSandboxes(ctx, sandbox.Filter{})
			return err
		},
	} {
		err := op()
		t.Logf("%s while the database is down: %v", name, err)
		if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "catalog unavailable") {
			t.Errorf("%s while the database is down: %v; want unavailable, saying the catalog is", name, err)
		}
		if err != nil && strings.Contains(err.Error(), "kiln-pg-") { // the server's socket dir
			t.Errorf("%s: the error %q shows the database's address", name, err)
		}
	}

	// Down for longer than the silence below.
	time.Sleep(1500 * time.Millisecond)
	pg.Start(t)
	if _, err := s.Nodes(ctx); err != nil {
		t.Fatalf("Nodes once the database is back: %v", err)
	}
	lost, err := s.MarkLost(ctx, time.Second)
	if err != nil || len(lost) != 0 {
		t.Errorf("MarkLost(1s) just after the database restarted: %v, %v; want nothing (the outage is not the node's silence)", lost, err)
	}
	ns, err := s.Nodes(ctx)
	if err != nil || len(ns) != 1 || ns[0].Quiet > time.Second {
		t.Errorf("Nodes after the restart: %+v, %v; want node-a quiet only since the restart", ns, err)
	}
	// Silent for the silence since the restart: lost.
	time.Sleep(1200 * time.Millisecond)
	ctx2, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if lost, err := s.MarkLost(ctx2, time.Second); err != nil || len(lost) != 1 {
		t.Errorf("MarkLost(1s) 1.2 s after the restart: %v, %v; want node-a", lost, err)
	}
}
