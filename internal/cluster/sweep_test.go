package cluster_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kiln-sh/kiln/internal/cluster"
	"github.com/kiln-sh/kiln/internal/store/postgres"
	"github.com/kiln-sh/kiln/internal/store/postgres/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// TestSweepExcusesOutage: a sweeper that could not reach the catalog (it
// refused connections for longer than the silence, without restarting)
// does not mark a node lost for the heartbeats nobody could write, as
// soon as the catalog is back; a node that stays silent afterwards is
// marked lost once the excuse has run out.
func TestSweepExcusesOutage(t *testing.T) {
	pg := pgtest.Private(t)
	ctx := t.Context()
	admin, err := pgx.Connect(ctx, pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(ctx, `CREATE DATABASE kiln`); err != nil {
		t.Fatal(err)
	}
	st, err := postgres.Open(ctx, strings.Replace(pg.URL(), "/postgres?", "/kiln?", 1))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Heartbeat(ctx, cluster.Node{Name: "a", URL: "http://a", Slots: 4, StartedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	const interval, silence = 200 * time.Millisecond, time.Second
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	go cluster.Sweep(sctx, st, interval, silence, slog.New(slog.NewTextHandler(io.Discard, nil)))

	// The outage: the catalog refuses the store's connections (and cuts
	// those it has) for twice the silence.
	block := func(allow bool) {
		t.Helper()
		q := `ALTER DATABASE kiln ALLOW_CONNECTIONS false`
		if allow {
			q = `ALTER DATABASE kiln ALLOW_CONNECTIONS true`
		}
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
		if !allow {
			if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = 'kiln'`); err != nil {
				t.Fatal(err)
			}
		}
	}
	block(false)
	time.Sleep(2 * silence)
	block(true)
	back := time.Now()
	state := func() string {
		t.Helper()
		ns, err := st.Nodes(ctx)
		if err != nil || len(ns) != 1 {
			t.Fatalf("Nodes: %v, %v", ns, err)
		}
		return ns[0].State
	}
	// Nobody heartbeats now: the node is silent for real. It is not lost
	// while the outage is excused, and lost afterwards.
	for time.Since(back) < silence {
		if s := state(); s != cluster.NodeLive {
			t.Fatalf("node %s %v after the catalog came back, want live (the outage excused)", s, time.Since(back).Round(time.Millisecond))
		}
		time.Sleep(50 * time.Millisecond)
	}
	for state() != cluster.NodeLost {
		if time.Since(back) > 10*time.Second {
			t.Fatalf("a silent node 10 s after the catalog came back: %s, want lost", state())
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("the silent node was marked lost %v after the catalog came back", time.Since(back).Round(time.Millisecond))
}
