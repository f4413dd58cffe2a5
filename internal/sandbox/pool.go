package sandbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/kiln-sh/kiln/internal/agentapi/channel"
	"github.com/kiln-sh/kiln/internal/errdefs"
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
//
// A pool is named as the server's operator names it (kiln serve --pool
// NAME=N, NAME "name[:tag]"): a built-in template's name is the built-in;
// any other name is the one custom template of that name and tag, public
// or private, whoever owns it (poolTemplate). A name that two owners use
// is ambiguous: that pool stays empty and the log says why. The filler
// resolves every pool's name again every poolRefresh, so when a build
// moves the name the pool's sandboxes of the old build are destroyed and
// it refills from the new one; a create claims a pooled sandbox only when
// it asks for the very build the pool holds (for its own private template
// of the same name, another owner gets one made for it).

// PoolStat is one template's pool, for metrics.
type PoolStat struct {
	Template     string // the pool's name, as configured
	Build        string // the build it holds ("" until resolved): a custom build's id, a built-in's hash
	Ready        int    // sandboxes waiting to be claimed
	Target       int    // ready sandboxes it is kept at now: Size, or more while demand grows it
	Size         int    // configured size
	Hits, Misses uint64 // creates of the template that did / did not get one
}

// pools is the set of pools of an Images.
type pools struct {
	mu      sync.Mutex
	targets map[string]int
	builds  map[string]string // pool name → hash of the build it holds ("": not resolved)
	ready   map[string][]*pooled
	hits    map[string]uint64
	misses  map[string]uint64
	closed  bool
	claimed time.Time // last claim; refills wait refillDelay after it

	// Sizing from demand (see target): a pool's configured size (targets)
	// is its floor; bursts is how far demand may grow it; demand holds the
	// times of the creates that asked it for a sandbox (hits and misses)
	// within demandWindow; filling counts fills in flight.
	bursts  map[string]int
	demand  map[string][]time.Time
	filling map[string]int

	wake   chan struct{} // 1-buffered: a claim happened
	cancel context.CancelFunc
	done   chan struct{} // closed when the filler returns
}

// pooled is a ready sandbox: running, unrecorded, unlisted.
type pooled struct {
	b    *box
	hash string // template build it was made from
	nat  bool   // it has a network (mode nat), with the pool's policy
}

// fillBackoff bounds the wait after a failed fill.
const fillBackoff = 30 * time.Second

// refillDelay is how long a refill waits after a claim: a restore takes
// both cores of a small host for a few hundred milliseconds, which the
// claimed sandbox's first requests would otherwise compete with.
const refillDelay = 300 * time.Millisecond

// demandWindow is how far back a pool counts the creates that asked it
// for a sandbox: a pool with a burst size is kept at as many ready
// sandboxes as creates asked for in the last demandWindow (within its
// size and its burst size), so a burst that comes again is served from
// the pool, and a minute after the last one the extras are destroyed.
const demandWindow = time.Minute

// burstFillers is how many fills run at once while a pool is above its
// configured size (demand grew it): two runsc boots in parallel make
// ~1.9 times the sandboxes per second of one on a 2-core host
// (docs/benchmarks.md, concurrency 1 vs 10). Otherwise one at a time.
const burstFillers = 2

// poolRefresh is how often the filler resolves the pools' names again.
const poolRefresh = 5 * time.Second

// StartPools keeps sizes[template] ready sandboxes of each template,
// refilled in the background until Close. A template with a warm step and
// no usable warm checkpoint gets one built first. Call it once (again
// after StopPools).
func (im *Images) StartPools(sizes map[string]int) {
	p := newPools()
	for name, n := range sizes {
		if n > 0 {
			p.targets[name] = n
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	im.mu.Lock()
	maps.Copy(p.bursts, im.poolBursts)
	im.pools = p
	im.mu.Unlock()
	go im.fill(ctx, p)
}

func newPools() *pools {
	return &pools{targets: map[string]int{}, builds: map[string]string{}, ready: map[string][]*pooled{}, hits: map[string]uint64{},
		misses: map[string]uint64{}, bursts: map[string]int{}, demand: map[string][]time.Time{}, filling: map[string]int{},
		wake: make(chan struct{}, 1), done: make(chan struct{})}
}

// SetPoolBursts lets demand grow each named pool up to bursts[name]
// ready sandboxes (kiln serve --pool-burst): a pool keeps as many as
// creates asked it for in the last minute, at least its size (StartPools,
// SetPoolSizes) and at most its burst size. A pool without one keeps its
// size. It holds across StartPools and SetPoolSizes.
func (im *Images) SetPoolBursts(bursts map[string]int) {
	im.mu.Lock()
	im.poolBursts = maps.Clone(bursts)
	p := im.pools
	im.mu.Unlock()
	if p == nil {
		return
	}
	p.mu.Lock()
	p.bursts = maps.Clone(bursts)
	if p.bursts == nil {
		p.bursts = map[string]int{}
	}
	p.mu.Unlock()
	p.kick()
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
		out = append(out, PoolStat{Template: name, Build: p.builds[name], Ready: len(p.ready[name]), Target: p.target(name, time.Now()),
			Size: p.targets[name], Hits: p.hits[name], Misses: p.misses[name]})
	}
	return out
}

// fill makes pooled sandboxes, the emptiest pool first: one at a time
// (the host's cores are better spent on one restore than on several
// racing), burstFillers at a time while demand holds a pool above its
// configured size. It destroys what a pool holds above its target once
// demand falls.
func (im *Images) fill(ctx context.Context, p *pools) {
	defer close(p.done)
	retryAt := map[string]time.Time{}
	fails := map[string]int{}
	type filled struct {
		name string
		err  error
	}
	results := make(chan filled)
	inflight := 0
	defer func() {
		for ; inflight > 0; inflight-- { // a fill in progress unwinds
			<-results
		}
	}()
	var refreshed time.Time
	for {
		if time.Since(refreshed) >= poolRefresh {
			im.refreshPools(ctx, p)
			refreshed = time.Now()
		}
		for _, e := range p.shed(time.Now()) {
			im.core.discard(context.WithoutCancel(ctx), e.b)
		}
		name, wait, workers := p.next(retryAt, time.Now())
		wait = min(wait, poolRefresh-time.Since(refreshed))
		if name != "" && inflight < workers {
			p.mu.Lock()
			p.filling[name]++
			p.mu.Unlock()
			inflight++
			go func() { results <- filled{name, im.fillOne(ctx, p, name)} }()
			continue
		}
		var r filled
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
			continue
		case <-time.After(wait):
			continue
		case r = <-results:
		}
		inflight--
		p.mu.Lock()
		p.filling[r.name]--
		p.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
		if r.err != nil {
			fails[r.name]++
			d := min(time.Duration(1<<min(fails[r.name], 5))*time.Second, fillBackoff)
			retryAt[r.name] = time.Now().Add(d)
			im.log.Error("filling sandbox pool", "template", r.name, "err", r.err, "retry_in", d)
			continue
		}
		fails[r.name] = 0
	}
}

// target is how many ready sandboxes the named pool is kept at, at now:
// the creates that asked it for one in the last demandWindow, at least
// its configured size and at most its burst size. p.mu is held.
func (p *pools) target(name string, now time.Time) int {
	floor := p.targets[name]
	if floor <= 0 {
		return 0
	}
	ceil := max(floor, p.bursts[name])
	if ceil == floor {
		return floor
	}
	asked := 0
	for _, t := range p.demand[name] {
		if now.Sub(t) < demandWindow {
			asked++
		}
	}
	return min(max(asked, floor), ceil)
}

// asked records a create that asked the named pool for a sandbox at now,
// forgetting those older than demandWindow. p.mu is held.
func (p *pools) asked(name string, now time.Time) {
	if p.bursts[name] <= p.targets[name] {
		return // a fixed size: nothing to count
	}
	d := p.demand[name]
	i := 0
	for i < len(d) && now.Sub(d[i]) >= demandWindow {
		i++
	}
	p.demand[name] = append(d[i:], now)
}

// shed removes and returns the ready sandboxes each pool holds above its
// target (the newest go: the oldest are claimed first).
func (p *pools) shed(now time.Time) []*pooled {
	p.mu.Lock()
	defer p.mu.Unlock()
	var extra []*pooled
	for name, q := range p.ready {
		if over := len(q) - p.target(name, now); over > 0 && p.targets[name] > 0 {
			extra = append(extra, q[len(q)-over:]...)
			p.ready[name] = append([]*pooled(nil), q[:len(q)-over]...)
		}
	}
	return extra
}

// next picks the pool furthest below its target (counting its fills in
// flight) that is not backing off; "" and how long to wait if there is
// none. workers is how many fills may run at once now.
func (p *pools) next(retryAt map[string]time.Time, now time.Time) (name string, wait time.Duration, workers int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	best, deficit, workers := "", 0, 1
	wait = time.Minute
	for name := range p.targets {
		if p.target(name, now) > p.targets[name] {
			workers = burstFillers
		}
	}
	if d := now.Sub(p.claimed); d < refillDelay {
		return "", refillDelay - d, workers
	}
	for name := range p.targets {
		d := p.target(name, now) - len(p.ready[name]) - p.filling[name]
		if d <= 0 {
			continue
		}
		if t := retryAt[name]; now.Before(t) {
			wait = min(wait, t.Sub(now))
			continue
		}
		if d > deficit {
			best, deficit = name, d
		}
	}
	return best, wait, workers
}

// refreshPools resolves every pool's name again and drains the pools
// whose name now means another build (or none).
func (im *Images) refreshPools(ctx context.Context, p *pools) {
	p.mu.Lock()
	names := slices.Collect(maps.Keys(p.targets))
	p.mu.Unlock()
	for _, name := range names {
		hash := ""
		if tmpl, err := im.poolTemplate(ctx, name); err == nil {
			hash = tmpl.Hash
		} else if !errors.Is(err, errdefs.ErrNotFound) {
			continue // keep what it holds; fillOne logs the error
		}
		im.setPoolBuild(ctx, p, name, hash)
	}
}

// setPoolBuild records that the named pool holds build hash and destroys
// its sandboxes of any other build.
func (im *Images) setPoolBuild(ctx context.Context, p *pools, name, hash string) {
	p.mu.Lock()
	var stale []*pooled
	if p.builds[name] != hash {
		p.builds[name] = hash
		q := p.ready[name]
		p.ready[name] = slices.DeleteFunc(slices.Clone(q), func(e *pooled) bool { return e.hash != hash })
		for _, e := range q {
			if e.hash != hash {
				stale = append(stale, e)
			}
		}
	}
	p.mu.Unlock()
	if len(stale) > 0 {
		im.log.Info("template moved to another build; draining its pool", "template", name, "build", hash, "drained", len(stale))
	}
	for _, e := range stale {
		im.core.discard(context.WithoutCancel(ctx), e.b)
	}
}

// poolTemplate resolves a pool's name ("name[:tag]") to the build it
// holds: a built-in's current build, or the one custom template of that
// name and tag among every owner's. Two owners' templates of the name make
// it ambiguous (ErrFailedPrecondition).
func (im *Images) poolTemplate(ctx context.Context, ref string) (*template.Template, error) {
	name, tag, err := template.ParseRef(ref)
	if err != nil {
		return nil, err
	}
	cat := im.cfg.catalog()
	if _, builtin := template.Builtin()[name]; builtin || cat.Store == nil {
		if tag != template.DefaultTag {
			return nil, fmt.Errorf("template %s:%s: %w", name, tag, errdefs.ErrNotFound)
		}
		return template.Lookup(im.cfg.DataDir, name)
	}
	tags, err := cat.Store.ListTags(ctx, "", name)
	if err != nil {
		return nil, fmt.Errorf("looking up template %s: %w", ref, err)
	}
	tags = slices.DeleteFunc(tags, func(t template.TagRecord) bool { return t.Tag != tag })
	switch len(tags) {
	case 0:
		return nil, fmt.Errorf("template %s:%s: %w", name, tag, errdefs.ErrNotFound)
	case 1:
		return cat.Load(ctx, tags[0].BuildID)
	}
	return nil, fmt.Errorf("pool %s: %d owners have a template %s:%s, so the pool cannot tell which to hold: %w",
		ref, len(tags), name, tag, errdefs.ErrFailedPrecondition)
}

// fillOne adds one sandbox to the named pool.
func (im *Images) fillOne(ctx context.Context, p *pools, name string) error {
	tmpl, err := im.poolTemplate(ctx, name)
	if err != nil {
		return err
	}
	im.setPoolBuild(ctx, p, name, tmpl.Hash)
	rt := im.runtimes[im.cfg.Runtime]
	limits, err := im.poolLimits(tmpl)
	if err != nil {
		return err
	}
	ck, why := im.warmCheckpoint(tmpl, rt, limits)
	if c, ok := rt.(oci.Checkpointer); ck == nil && tmpl.Warm != nil && ok && c.CanCheckpoint() {
		im.log.Info("building the warm checkpoint for the pool", "template", name, "reason", why)
		if _, err := im.BuildWarmTemplate(ctx, tmpl); err != nil {
			im.log.Error("building warm checkpoint; the pool fills cold", "template", name, "err", err)
		}
		ck, why = im.warmCheckpoint(tmpl, rt, limits)
	}
	if why != "" {
		im.log.Info("booting cold", "template", name, "reason", why)
	}
	net, err := im.core.resolveNetwork(nil, tmpl.Defaults.Network)
	if err != nil {
		return err
	}
	b, err := im.core.unlisted(ctx, tmpl, rt, limits, ck, im.cfg.StateDir, net)
	if err != nil {
		return err
	}
	p.mu.Lock()
	if p.closed || p.builds[name] != tmpl.Hash { // closed, or moved on while it booted
		p.mu.Unlock()
		im.core.discard(context.WithoutCancel(ctx), b)
		return nil
	}
	conn := b.conn // before others can claim b and destroy it
	p.ready[name] = append(p.ready[name], &pooled{b: b, hash: tmpl.Hash, nat: net != nil})
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
// want (with a network if nat) from the pool that holds tmpl's build,
// counting a hit or a miss; nil if there is none, and "" if no pool holds
// the build.
func (p *pools) take(tmpl *template.Template, want Sandbox, nat bool, runtime string, limits Limits) (_ *pooled, name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, ""
	}
	for n, hash := range p.builds {
		if hash == tmpl.Hash && p.targets[n] > 0 {
			name = n
			break
		}
	}
	if name == "" {
		return nil, ""
	}
	p.asked(name, time.Now())
	q := p.ready[name]
	if len(q) == 0 || want.Runtime != runtime || want.Limits != limits || q[0].nat != nat {
		p.misses[name]++
		return nil, name
	}
	e := q[0]
	p.ready[name] = q[1:]
	p.hits[name]++
	p.claimed = time.Now()
	p.kick()
	return e, name
}

// claim turns a pooled sandbox into the sandbox want describes (its id
// aside): owner, env, metadata, timeout, and network policy net (nil: no
// network). It reports false when there was none to claim (Create then
// makes one); an error is a quota refusal.
func (im *Images) claim(ctx context.Context, want Sandbox, net *NetworkOptions, tmpl *template.Template, q Quota) (Sandbox, bool, error) {
	p := im.pool()
	if p == nil {
		return Sandbox{}, false, nil
	}
	limits, err := im.poolLimits(tmpl)
	if err != nil {
		return Sandbox{}, false, nil
	}
	e, name := p.take(tmpl, want, net != nil, im.runtimes[im.cfg.Runtime].Name(), limits)
	if e == nil {
		return Sandbox{}, false, nil
	}
	t0 := time.Now()
	log := im.log.With("sandbox_id", e.b.rec.ID, "template", tmpl.Name, "pool", name)
	if net != nil {
		if err := im.core.claimNetwork(ctx, e.b, net); err != nil {
			p.mu.Lock()
			p.hits[name]--
			p.misses[name]++
			p.mu.Unlock()
			log.Warn("claiming a pooled sandbox failed; creating one", "err", err)
			im.core.discard(context.WithoutCancel(ctx), e.b)
			return Sandbox{}, false, nil
		}
	}
	rec, kept, err := im.core.enlist(ctx, e.b, want, q, tmpl.Warm)
	switch {
	case kept: // a quota refusal
		p.putBack(name, e)
		return Sandbox{}, false, err
	case err != nil:
		p.mu.Lock()
		p.hits[name]--
		p.misses[name]++
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
