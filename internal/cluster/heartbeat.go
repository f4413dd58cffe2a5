package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Beat is a node's heartbeat in the catalog: its entry (asked of self at
// each beat, so the templates a node has stay current) and whether it is
// draining.
type Beat struct {
	st       Store
	interval time.Duration
	self     func() Node
	revived  func(context.Context)
	log      *slog.Logger

	mu       sync.Mutex // one write at a time: a drain's is never undone by an older beat
	draining atomic.Bool
	reviving sync.Mutex // held while revived runs
}

// Heartbeat writes self's heartbeat into st at once, then every
// interval in the background until ctx ends. The first heartbeat's error
// is returned (a node that cannot register must not serve); later ones
// are logged, and retried every quarter interval until one is written,
// so that a node is back in the catalog as soon as the catalog is back
// (heartbeats missed while the catalog was down are not held against it:
// see Store.MarkLost and Sweep). A heartbeat that finds the node marked
// lost (it was cut off or frozen, not dead) calls revived, which must end
// the sandboxes the catalog failed.
func Heartbeat(ctx context.Context, st Store, interval time.Duration, self func() Node,
	revived func(context.Context), log *slog.Logger) (*Beat, error) {
	b := &Beat{st: st, interval: interval, self: self, revived: revived, log: log}
	n := self()
	back, err := b.write(ctx)
	if err != nil {
		return nil, fmt.Errorf("registering node %s: %w", n.Name, err)
	}
	if back {
		revived(ctx)
	}
	log.Info("registered in the catalog", "node", n.Name, "url", n.URL, "slots", n.Slots, "runtimes", n.Runtimes)
	go b.loop(ctx)
	return b, nil
}

func (b *Beat) loop(ctx context.Context) {
	failing := false
	for {
		wait := b.interval
		if failing {
			wait = b.interval / 4
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		back, err := b.write(ctx)
		switch {
		case err != nil && !failing && ctx.Err() == nil:
			b.log.Warn("heartbeat failed; retrying until the catalog takes one", "err", err)
		case err == nil && failing:
			b.log.Info("heartbeat written again")
		}
		failing = err != nil
		// Beside the heartbeat, which must go on meanwhile: ending many
		// sandboxes takes seconds, and fronts refuse a quiet node.
		if back && b.reviving.TryLock() {
			b.log.Warn("this node was marked lost and is back: ending the sandboxes the catalog failed")
			go func() {
				defer b.reviving.Unlock()
				b.revived(ctx)
			}()
		}
	}
}

// write writes one heartbeat. It may not outlast the interval: a late
// heartbeat is as good as a missed one.
func (b *Beat) write(ctx context.Context) (bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := b.self()
	if b.draining.Load() {
		n.State = NodeDraining
	}
	hctx, cancel := context.WithTimeout(ctx, b.interval)
	defer cancel()
	return b.st.Heartbeat(hctx, n)
}

// Drain marks the node draining: in the catalog at once (placement
// passes it over from the next listing on) and in every heartbeat after.
// A drain that could not be written now is written by the next heartbeat.
func (b *Beat) Drain(ctx context.Context) error {
	b.draining.Store(true)
	if _, err := b.write(ctx); err != nil {
		return fmt.Errorf("marking the node draining: %w", err)
	}
	return nil
}

// Draining reports whether Drain was called.
func (b *Beat) Draining() bool { return b != nil && b.draining.Load() }

// Sweep marks lost, every interval until ctx ends, the nodes silent for
// longer than silence, with their sandboxes (Store.MarkLost). Every front
// and node sweeps; the catalog sees to it that each lost node is marked
// once.
//
// A sweeper that could not reach the catalog does not count the time it
// could not against the nodes: nodes could not heartbeat either (the
// catalog was down, or the network to it). Once the catalog answers again
// it excuses as much silence as its own outage lasted, plus two
// intervals, until the nodes have had silence to heartbeat again; only a
// node silent for longer than that is marked lost.
func Sweep(ctx context.Context, st Store, interval, silence time.Duration, log *slog.Logger) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var (
		failedSince time.Time     // zero while the catalog answers
		excuse      time.Duration // silence forgiven after an outage
		until       time.Time     // when the excuse ends
	)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		if !until.IsZero() && now.After(until) {
			excuse, until = 0, time.Time{}
		}
		if !failedSince.IsZero() { // this sweep may be the first to get through
			excuse = max(excuse, now.Sub(failedSince)+2*interval)
		}
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		lost, err := st.MarkLost(sctx, silence+excuse)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil:
			if failedSince.IsZero() {
				failedSince = now
				log.Warn("sweeping for lost nodes; the silence of nodes is not counted until the catalog answers", "err", err)
			}
			continue
		case err == nil && !failedSince.IsZero():
			until = now.Add(silence + excuse)
			failedSince = time.Time{}
			log.Info("the catalog answers again; sweeping resumes, excusing the outage", "excused", excuse.Round(time.Millisecond))
		}
		for _, n := range lost {
			log.Warn("node lost; its sandboxes are failed", "node", n.Name, "reason", n.Reason)
		}
	}
}
