package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"time"
)

// Heartbeat writes self's heartbeat into st at once, then every
// interval in the background until ctx ends. self is asked each time, so
// the templates a node has stay current. The first heartbeat's error is
// returned (a node that cannot register must not serve); later ones are
// logged, and the node is marked lost if they keep failing. A heartbeat
// that finds the node marked lost (it was cut off or frozen, not dead)
// calls revived, which must end the sandboxes the catalog failed.
func Heartbeat(ctx context.Context, st Store, interval time.Duration, self func() Node,
	revived func(context.Context), log *slog.Logger) error {
	n := self()
	back, err := st.Heartbeat(ctx, n)
	if err != nil {
		return fmt.Errorf("registering node %s: %w", n.Name, err)
	}
	if back {
		revived(ctx)
	}
	log.Info("registered in the catalog", "node", n.Name, "url", n.URL, "slots", n.Slots, "runtimes", n.Runtimes)
	go func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		failing := false
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			// A heartbeat may not outlast its interval: a late one is
			// as good as a missed one.
			hctx, cancel := context.WithTimeout(ctx, interval)
			back, err := st.Heartbeat(hctx, self())
			cancel()
			switch {
			case err != nil && !failing && ctx.Err() == nil:
				log.Warn("heartbeat failed", "err", err)
			case err == nil && failing:
				log.Info("heartbeat written again")
			}
			failing = err != nil
			if back {
				log.Warn("this node was marked lost and is back: ending the sandboxes the catalog failed")
				revived(ctx)
			}
		}
	}()
	return nil
}

// Sweep marks lost, every interval until ctx ends, the nodes silent for
// longer than silence, with their sandboxes (Store.MarkLost). Every front
// and node sweeps; the catalog sees to it that each lost node is marked
// once.
func Sweep(ctx context.Context, st Store, interval, silence time.Duration, log *slog.Logger) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		lost, err := st.MarkLost(sctx, silence)
		cancel()
		if err != nil && ctx.Err() == nil {
			log.Warn("sweeping for lost nodes", "err", err)
		}
		for _, n := range lost {
			log.Warn("node lost; its sandboxes are failed", "node", n.Name, "reason", n.Reason)
		}
	}
}
