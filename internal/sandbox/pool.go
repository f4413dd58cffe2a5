package sandbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/kiln-sh/kiln/internal/agentapi/channel"
	"github.com/kiln-sh/kiln/internal/oci"
	"github.com/kiln-sh/kiln/internal/rootfs"
	"github.com/kiln-sh/kiln/internal/template"
)

// Warm pools. A template may have a pool of ready sandboxes (default
// runtime, the template's default limits and env), restored from its warm
// checkpoint when it has one. Create claims one when the request is
// compatible: it gets the request's owner, env, metadata and timeout and
// is recorded, in milliseconds; the pool is refilled in the background.
// Pooled sandboxes have no record (List never shows them), are not in the
// Manager's live set (quotas and the reaper ignore them), are destroyed by
// Close, and a crash leaves only their dirs, which the next start's
// adoption removes as orphans.

// PoolStat is one template's pool, for metrics.
type PoolStat struct {
	Template     string
	Ready        int    // sandboxes waiting to be claimed
	Target       int    // configured size
	Hits, Misses uint64 // creates of the template that did / did not get one
}

// pools is the Manager's set of pools.
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
	hash string  // template build it was made from
	rec  Sandbox // its record while pooled, kept by claim
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
func (m *Manager) StartPools(sizes map[string]int) {
	p := &pools{targets: map[string]int{}, ready: map[string][]*pooled{}, hits: map[string]uint64{},
		misses: map[string]uint64{}, wake: make(chan struct{}, 1), done: make(chan struct{})}
	for name, n := range sizes {
		if n > 0 {
			p.targets[name] = n
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	m.mu.Lock()
	m.pools = p
	m.mu.Unlock()
	go m.fill(ctx, p)
}

func (m *Manager) pool() *pools {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pools
}

// PoolStats reports the pools, by template.
func (m *Manager) PoolStats() []PoolStat {
	p := m.pool()
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
func (m *Manager) fill(ctx context.Context, p *pools) {
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
		err := m.fillOne(ctx, p, name)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			fails[name]++
			d := min(time.Duration(1<<min(fails[name], 5))*time.Second, fillBackoff)
			retryAt[name] = time.Now().Add(d)
			m.log.Error("filling sandbox pool", "template", name, "err", err, "retry_in", d)
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
func (m *Manager) fillOne(ctx context.Context, p *pools, name string) error {
	tmpl, err := template.Lookup(m.cfg.DataDir, name)
	if err != nil {
		return err
	}
	rt := m.runtimes[m.cfg.Runtime]
	limits, err := m.poolLimits(tmpl)
	if err != nil {
		return err
	}
	if c, why := m.warmCheckpoint(tmpl, rt, limits); c == nil && tmpl.Warm != nil {
		if ck, ok := rt.(oci.Checkpointer); ok && ck.CanCheckpoint() {
			m.log.Info("building the warm checkpoint for the pool", "template", name, "reason", why)
			if _, err := m.BuildWarm(ctx, name); err != nil {
				m.log.Error("building warm checkpoint; the pool fills cold", "template", name, "err", err)
			}
		}
	}
	b, err := m.hiddenBox(ctx, tmpl, rt, limits, true, m.cfg.StateDir)
	if err != nil {
		return err
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		m.discard(context.WithoutCancel(ctx), b)
		return nil
	}
	conn := b.conn // before others can claim b and destroy it
	p.ready[name] = append(p.ready[name], &pooled{b: b, hash: tmpl.Hash})
	p.mu.Unlock()
	go m.watchPooled(p, name, b, conn)
	return nil
}

// poolLimits are the limits of a template's pooled sandboxes: its defaults.
func (m *Manager) poolLimits(tmpl *template.Template) (Limits, error) {
	d := tmpl.Defaults
	return limitsFor(Limits{}, Limits{CPUs: d.CPUs, MemoryBytes: d.MemoryBytes, DiskBytes: d.DiskBytes}, m.cfg.Limits)
}

// watchPooled destroys a pooled sandbox that dies before it is claimed;
// once claimed, it watches it like any other (see watch). conn is b's
// session when it was pooled.
func (m *Manager) watchPooled(p *pools, name string, b *box, conn *channel.Conn) {
	go m.liveness(b, conn)
	<-conn.Done()
	p.mu.Lock()
	i := slices.IndexFunc(p.ready[name], func(e *pooled) bool { return e.b == b })
	if i >= 0 {
		p.ready[name] = slices.Delete(p.ready[name], i, i+1)
	}
	p.mu.Unlock()
	if i < 0 { // claimed (then watched like any sandbox), or taken by Close
		if _, err := m.box(b.rec.ID); err == nil {
			m.watch(b, conn)
		}
		return
	}
	m.log.Warn("pooled sandbox died; replacing it", "sandbox_id", b.rec.ID, "template", name)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m.discard(ctx, b)
	p.kick()
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
func (m *Manager) claim(ctx context.Context, want Sandbox, tmpl *template.Template, q Quota) (Sandbox, bool, error) {
	p := m.pool()
	if p == nil {
		return Sandbox{}, false, nil
	}
	limits, err := m.poolLimits(tmpl)
	if err != nil {
		return Sandbox{}, false, nil
	}
	e, stale := p.take(tmpl, want, m.runtimes[m.cfg.Runtime].Name(), limits)
	for _, s := range stale {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			m.discard(ctx, s.b)
		}()
	}
	if e == nil {
		return Sandbox{}, false, nil
	}
	e.rec = e.b.rec // to put it back as it was
	t0 := time.Now()
	b := e.b
	b.mu.Lock()
	oldEnv := b.rec.Env
	rec := want
	rec.ID, rec.State, rec.Reason = b.rec.ID, StateRunning, ""
	b.rec = rec
	b.mu.Unlock()
	log := m.log.With("sandbox_id", rec.ID, "template", tmpl.Name)
	if err := m.admit(b, q); err != nil {
		b.mu.Lock()
		b.rec = e.rec
		b.mu.Unlock()
		p.putBack(tmpl.Name, e)
		return Sandbox{}, false, err
	}
	fail := func(err error) (Sandbox, bool, error) {
		p.mu.Lock()
		p.hits[tmpl.Name]--
		p.misses[tmpl.Name]++
		p.mu.Unlock()
		log.Warn("claiming a pooled sandbox failed; creating one", "err", err)
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if derr := m.destroy(uctx, rec.ID, StateFailed, "claiming from the pool: "+err.Error()); derr != nil {
			log.Error("destroying pooled sandbox", "err", derr)
		}
		_ = m.store.DeleteSandbox(uctx, rec.ID)
		return Sandbox{}, false, nil
	}
	b.mu.Lock()
	conn := b.conn
	b.mu.Unlock()
	if conn == nil {
		return fail(errors.New("it was destroyed"))
	}
	select {
	case <-conn.Done():
		return fail(errors.New("it died in the pool"))
	default:
	}
	if err := m.store.PutSandbox(ctx, rec); err != nil {
		return fail(fmt.Errorf("recording sandbox: %w", err))
	}
	if !maps.Equal(oldEnv, rec.Env) {
		if err := m.identify(ctx, conn, rec, warmKernelCode(tmpl.Warm, rec, false), false); err != nil {
			return fail(err)
		}
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
// Manager's Close does it too.
func (m *Manager) StopPools() { m.closePools() }

// closePools stops the filler and destroys every pooled sandbox.
func (m *Manager) closePools() {
	p := m.pool()
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
		wg.Go(func() { m.discard(ctx, e.b) })
	}
	wg.Wait()
	m.mu.Lock()
	if m.pools == p {
		m.pools = nil // StartPools may start new ones
	}
	m.mu.Unlock()
}

// hiddenBox makes a running sandbox of tmpl on rt with limits and the
// template's env that has no record and is not in the live set, with its
// state dir in stateDir: a pooled sandbox (warm: restored from the warm
// checkpoint if there is one) or the one a warm checkpoint is taken from
// (booted). On failure it leaves nothing behind.
func (m *Manager) hiddenBox(ctx context.Context, tmpl *template.Template, rt oci.Runtime, limits Limits, warm bool, stateDir string) (_ *box, err error) {
	id := NewID()
	env := maps.Clone(tmpl.Defaults.Env)
	if env == nil {
		env = map[string]string{}
	}
	b := &box{dir: filepath.Join(stateDir, id.String()), rec: Sandbox{
		ID: id, Template: tmpl.Name, Runtime: rt.Name(), State: StateCreating, Limits: limits,
		User: tmpl.Defaults.User, Workdir: tmpl.Defaults.Workdir, Env: env, Node: m.cfg.Node,
		CreatedAt: time.Now().UTC(),
	}}
	var c cleanup
	defer func() {
		if err != nil {
			if uerr := c.unwind(ctx); uerr != nil {
				m.log.Error("unwinding unlisted sandbox", "sandbox_id", id, "err", uerr)
			}
		}
	}()
	if err := m.enroll(ctx, pathPool, b, nil, &c); err != nil {
		return nil, err
	}
	conn, _, err := m.launch(ctx, b, rt, tmpl, warm, warm, &c)
	if err != nil {
		return nil, err
	}
	c.release()
	b.conn, b.rec.State = conn, StateRunning
	return b, nil
}

// discard destroys a sandbox that has no record: its session, container,
// layer and dir.
func (m *Manager) discard(ctx context.Context, b *box) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.conn != nil {
		b.conn.Close()
		b.conn = nil
	}
	b.rec.State = StateStopped
	var errs []error
	if rt := m.runtimes[b.rec.Runtime]; rt != nil {
		errs = append(errs, deleteContainer(ctx, rt, b.rec.ID, b.dir, b.procs.get()))
	}
	errs = append(errs, rootfs.Unmount(ctx, filepath.Join(b.dir, layerDir)))
	if err := errors.Join(errs...); err != nil {
		m.log.Error("destroying unlisted sandbox", "sandbox_id", b.rec.ID, "err", err)
		return
	}
	if err := os.RemoveAll(b.dir); err != nil {
		m.log.Error("removing unlisted sandbox dir", "sandbox_id", b.rec.ID, "err", err)
	}
}
