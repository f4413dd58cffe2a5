package sandbox

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/kiln-sh/kiln/internal/agentapi/channel"
	"github.com/kiln-sh/kiln/internal/oci"
	"github.com/kiln-sh/kiln/internal/template"
)

// Warm pools (Images). A template may have a pool of ready sandboxes
// (default runtime, the template's default limits and env), restored from
// its warm checkpoint when it has one. The Manager's Create claims one
// through its image seam when the request is compatible: it gets the
// request's owner, env, metadata and timeout and is recorded (the core's
// enlist), in milliseconds; the pool is refilled in the background.
// Pooled sandboxes are unlisted (unlisted.go): no record (List never shows
// them), not in the Manager's live set (quotas and the reaper ignore
// them); the Manager's Close destroys them, and a crash leaves only their
// dirs, which the next start's adoption removes as orphans.

// PoolStat is one template's pool, for metrics.
type PoolStat struct {
	Template     string
	Ready        int    // sandboxes waiting to be claimed
	Target       int    // configured size
	Hits, Misses uint64 // creates of the template that did / did not get one
}

// pools is the set of pools of an Images.
type pools struct {
	mu      sync.Mutex
	targets map[string]int
	ready   map[string][]*pooled
	hits    map[string]uint64
	misses  map[string]uint64
	closed  bool
	claimed time.Time // last claim; refills wait refillDelay after it

	wake   chan struct{} // 1-buffered: a claim happened
	cancel context.CancelFunc
	done   chan struct{} // closed when the filler returns
}

// pooled is a ready sandbox: running, unrecorded, unlisted.
type pooled struct {
	b    *box
	hash string // template build it was made from
}

// fillBackoff bounds the wait after a failed fill.
const fillBackoff = 30 * time.Second

// refillDelay is how long a refill waits after a claim: a restore takes
// both cores of a small host for a few hundred milliseconds, which the
// claimed sandbox's first requests would otherwise compete with.
const refillDelay = 300 * time.Millisecond

// StartPools keeps sizes[template] ready sandboxes of each template,
// refilled in the background until Close. A template with a warm step and
// no usable warm checkpoint gets one built first. Call it once (again
// after StopPools).
func (im *Images) StartPools(sizes map[string]int) {
	p := &pools{targets: map[string]int{}, ready: map[string][]*pooled{}, hits: map[string]uint64{},
		misses: map[string]uint64{}, wake: make(chan struct{}, 1), done: make(chan struct{})}
	for name, n := range sizes {
		if n > 0 {
			p.targets[name] = n
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	im.mu.Lock()
	im.pools = p
	im.mu.Unlock()
	go im.fill(ctx, p)
}

func (im *Images) pool() *pools {
	im.mu.Lock()
	defer im.mu.Unlock()
	return im.pools
}

// PoolStats reports the pools, by template.
func (im *Images) PoolStats() []PoolStat {
	p := im.pool()
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []PoolStat
	for _, name := range slices.Sorted(maps.Keys(p.targets)) {
		out = append(out, PoolStat{Template: name, Ready: len(p.ready[name]), Target: p.targets[name],
			Hits: p.hits[name], Misses: p.misses[name]})
	}
	return out
}

// fill makes pooled sandboxes one at a time (the host's cores are better
// spent on one restore than on several racing), the emptiest pool first.
func (im *Images) fill(ctx context.Context, p *pools) {
	defer close(p.done)
	retryAt := map[string]time.Time{}
	fails := map[string]int{}
	for {
		name, wait := p.next(retryAt)
		if name == "" {
			select {
			case <-ctx.Done():
				return
			case <-p.wake:
			case <-time.After(wait):
			}
			continue
		}
		err := im.fillOne(ctx, p, name)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			fails[name]++
			d := min(time.Duration(1<<min(fails[name], 5))*time.Second, fillBackoff)
			retryAt[name] = time.Now().Add(d)
			im.log.Error("filling sandbox pool", "template", name, "err", err, "retry_in", d)
			continue
		}
		fails[name] = 0
	}
}

// next picks the pool furthest below its target that is not backing off;
// "" and how long to wait if there is none.
func (p *pools) next(retryAt map[string]time.Time) (string, time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	best, deficit, wait := "", 0, time.Minute
	if d := time.Since(p.claimed); d < refillDelay {
		return "", refillDelay - d
	}
	for name, target := range p.targets {
		d := target - len(p.ready[name])
		if d <= 0 {
			continue
		}
		if t := retryAt[name]; time.Now().Before(t) {
			wait = min(wait, time.Until(t))
			continue
		}
		if d > deficit {
			best, deficit = name, d
		}
	}
	return best, wait
}

// fillOne adds one sandbox to the named pool.
func (im *Images) fillOne(ctx context.Context, p *pools, name string) error {
	tmpl, err := template.Lookup(im.cfg.DataDir, name)
	if err != nil {
		return err
	}
	rt := im.runtimes[im.cfg.Runtime]
	limits, err := im.poolLimits(tmpl)
	if err != nil {
		return err
	}
	ck, why := im.warmCheckpoint(tmpl, rt, limits)
	if c, ok := rt.(oci.Checkpointer); ck == nil && tmpl.Warm != nil && ok && c.CanCheckpoint() {
		im.log.Info("building the warm checkpoint for the pool", "template", name, "reason", why)
		if _, err := im.BuildWarm(ctx, name); err != nil {
			im.log.Error("building warm checkpoint; the pool fills cold", "template", name, "err", err)
		}
		ck, why = im.warmCheckpoint(tmpl, rt, limits)
	}
	if why != "" {
		im.log.Info("booting cold", "template", name, "reason", why)
	}
	b, err := im.core.unlisted(ctx, tmpl, rt, limits, ck, im.cfg.StateDir)
	if err != nil {
		return err
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		im.core.discard(context.WithoutCancel(ctx), b)
		return nil
	}
	conn := b.conn // before others can claim b and destroy it
	p.ready[name] = append(p.ready[name], &pooled{b: b, hash: tmpl.Hash})
	p.mu.Unlock()
	go im.watchPooled(p, name, b, conn)
	return nil
}

// poolLimits are the limits of a template's pooled sandboxes: its defaults.
func (im *Images) poolLimits(tmpl *template.Template) (Limits, error) {
	d := tmpl.Defaults
	return limitsFor(Limits{}, Limits{CPUs: d.CPUs, MemoryBytes: d.MemoryBytes, DiskBytes: d.DiskBytes}, im.cfg.Limits)
}

// watchPooled has the core watch a pooled sandbox (see watchUnlisted)
// and destroys it if it dies before it is claimed; once claimed, the core
// watches it like any other. conn is b's session when it was pooled.
func (im *Images) watchPooled(p *pools, name string, b *box, conn *channel.Conn) {
	im.core.watchUnlisted(b, conn, func() {
		p.mu.Lock()
		i := slices.IndexFunc(p.ready[name], func(e *pooled) bool { return e.b == b })
		if i >= 0 {
			p.ready[name] = slices.Delete(p.ready[name], i, i+1)
		}
		p.mu.Unlock()
		if i < 0 { // being claimed, or taken by Close
			return
		}
		im.log.Warn("pooled sandbox died; replacing it", "sandbox_id", b.rec.ID, "template", name)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		im.core.discard(ctx, b)
		p.kick()
	})
}

func (p *pools) kick() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// take removes and returns a ready sandbox of tmpl for a sandbox like
// want, counting a hit or a miss; nil if there is none.
// Sandboxes of an older build of the template are removed from the pool
// and returned as stale, for the caller to destroy.
func (p *pools) take(tmpl *template.Template, want Sandbox, runtime string, limits Limits) (_ *pooled, stale []*pooled) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.targets[tmpl.Name] == 0 {
		return nil, nil
	}
	q := p.ready[tmpl.Name]
	for len(q) > 0 && q[0].hash != tmpl.Hash {
		stale, q = append(stale, q[0]), q[1:]
	}
	p.ready[tmpl.Name] = q
	if len(stale) > 0 {
		p.kick()
	}
	if len(q) == 0 || want.Runtime != runtime || want.Limits != limits {
		p.misses[tmpl.Name]++
		return nil, stale
	}
	e := q[0]
	p.ready[tmpl.Name] = q[1:]
	p.hits[tmpl.Name]++
	p.claimed = time.Now()
	p.kick()
	return e, stale
}

// claim turns a pooled sandbox into the sandbox want describes (its id
// aside): owner, env, metadata, timeout. It reports false when there was
// none to claim (Create then makes one); an error is a quota refusal.
func (im *Images) claim(ctx context.Context, want Sandbox, tmpl *template.Template, q Quota) (Sandbox, bool, error) {
	p := im.pool()
	if p == nil {
		return Sandbox{}, false, nil
	}
	limits, err := im.poolLimits(tmpl)
	if err != nil {
		return Sandbox{}, false, nil
	}
	e, stale := p.take(tmpl, want, im.runtimes[im.cfg.Runtime].Name(), limits)
	for _, s := range stale {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			im.core.discard(ctx, s.b)
		}()
	}
	if e == nil {
		return Sandbox{}, false, nil
	}
	t0 := time.Now()
	rec, kept, err := im.core.enlist(ctx, e.b, want, q, tmpl.Warm)
	log := im.log.With("sandbox_id", e.b.rec.ID, "template", tmpl.Name)
	switch {
	case kept: // a quota refusal
		p.putBack(tmpl.Name, e)
		return Sandbox{}, false, err
	case err != nil:
		p.mu.Lock()
		p.hits[tmpl.Name]--
		p.misses[tmpl.Name]++
		p.mu.Unlock()
		log.Warn("claiming a pooled sandbox failed; creating one", "err", err)
		return Sandbox{}, false, nil
	}
	log.Info("sandbox created", "from", "pool", "took", time.Since(t0))
	return rec, true, nil
}

// putBack returns a sandbox that could not be claimed to the front of
// its pool.
func (p *pools) putBack(name string, e *pooled) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hits[name]--
	p.misses[name]++
	p.ready[name] = append([]*pooled{e}, p.ready[name]...)
}

// StopPools stops filling the pools and destroys their sandboxes; the
// Manager's Close does it too (through its image seam).
func (im *Images) StopPools() { im.closePools() }

// closePools stops the filler and destroys every pooled sandbox.
func (im *Images) closePools() {
	p := im.pool()
	if p == nil {
		return
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.cancel()
	var all []*pooled
	for name, q := range p.ready {
		all = append(all, q...)
		delete(p.ready, name)
	}
	p.mu.Unlock()
	<-p.done // a fill in progress unwinds
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for _, e := range all {
		wg.Go(func() { im.core.discard(ctx, e.b) })
	}
	wg.Wait()
	im.mu.Lock()
	if im.pools == p {
		im.pools = nil // StartPools may start new ones
	}
	im.mu.Unlock()
}
