package sandbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"time"

	"github.com/kiln-sh/kiln/internal/agentapi/channel"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/oci"
	"github.com/kiln-sh/kiln/internal/rootfs"
	"github.com/kiln-sh/kiln/internal/template"
)

// Unlisted sandboxes: running, but with no record and outside the live
// set (quotas, the reaper and List ignore them). Images keeps them (a
// pool's ready sandboxes, a warm build's); the core brings them up, lists
// one when a create claims it, watches and destroys them. These are core
// operations Images uses (images.go).

// unlisted makes a running sandbox of tmpl on rt with limits and the
// template's env that has no record and is not in the live set, with its
// state dir in stateDir: a pooled sandbox (restored from the warm
// checkpoint ck if there is one, settled: see launch) or the one a warm
// checkpoint is taken from (ck nil: booted). net is its network (nil:
// none; a pooled sandbox has the one a create that does not ask would
// get, and a claim sets the create's policy). On failure it leaves
// nothing behind.
func (m *Manager) unlisted(ctx context.Context, tmpl *template.Template, rt oci.Runtime, limits Limits, ck *template.Checkpoint, stateDir string, net *NetworkOptions) (_ *box, err error) {
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
	if err := m.attachNetwork(ctx, pathPool, b, net, &c); err != nil {
		return nil, err
	}
	conn, _, err := m.launch(ctx, b, rt, tmpl, ck, "", true, &c)
	if err != nil {
		return nil, err
	}
	if err := m.configureDNS(ctx, id, conn); err != nil {
		return nil, err
	}
	c.release()
	b.conn, b.rec.State = conn, StateRunning
	return b, nil
}

// enlist makes the unlisted running sandbox b the listed sandbox want
// describes (its id aside: b keeps its own): owner, env, metadata,
// timeout, admitted against the owner's quota q and recorded; an agent
// whose env changed is told its new identity, and the kernel of warm step
// w its new env. A quota refusal leaves b unlisted as it was and returns
// kept true with the refusal; any other failure destroys b and deletes its
// record.
func (m *Manager) enlist(ctx context.Context, b *box, want Sandbox, q Quota, w *template.Warm) (_ Sandbox, kept bool, err error) {
	b.mu.Lock()
	old := b.rec
	rec := want
	rec.ID, rec.State, rec.Reason = old.ID, StateRunning, ""
	b.rec = rec
	conn := b.conn
	b.mu.Unlock()
	if err := m.admit(b, q); err != nil {
		b.mu.Lock()
		b.rec = old
		b.mu.Unlock()
		return Sandbox{}, true, err
	}
	defer func() {
		if err != nil {
			if rerr := m.retract(ctx, rec.ID, StateFailed, "claiming from the pool: "+err.Error()); rerr != nil {
				m.log.Error("destroying pooled sandbox", "sandbox_id", rec.ID, "err", rerr)
			}
		}
	}()
	switch {
	case conn == nil:
		return Sandbox{}, false, errors.New("it was destroyed")
	case ended(conn):
		return Sandbox{}, false, errors.New("it died in the pool")
	}
	if err := m.store.PutSandbox(ctx, rec); err != nil {
		return Sandbox{}, false, fmt.Errorf("recording sandbox: %w", err)
	}
	if !maps.Equal(old.Env, rec.Env) {
		if err := m.identify(ctx, conn, rec, warmKernelCode(w, rec, false), false); err != nil {
			return Sandbox{}, false, err
		}
	}
	return rec, false, nil
}

// retract destroys a listed sandbox that was made in vain, as final with
// reason, and deletes its record: as far as clients know it never was.
// One already gone is fine.
func (m *Manager) retract(ctx context.Context, id ID, final State, reason string) error {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unwindTimeout)
	defer cancel()
	err := m.destroy(uctx, id, final, reason)
	if errors.Is(err, errdefs.ErrNotFound) {
		err = nil
	}
	return errors.Join(err, m.store.DeleteSandbox(uctx, id))
}

// watchUnlisted watches unlisted sandbox b on its session conn: liveness
// pings as for any sandbox (an unresponsive one's session is closed, see
// failUnresponsive). When the session ends, a sandbox enlisted meanwhile
// is failed and destroyed like any (watch); one still unlisted is left to
// gone (the pool drops and discards it, unless a claim or Close took it).
func (m *Manager) watchUnlisted(b *box, conn *channel.Conn, gone func()) {
	go m.liveness(b, conn)
	<-conn.Done()
	b.mu.Lock() // enlist may be replacing the record
	id := b.rec.ID
	b.mu.Unlock()
	if listed, err := m.box(id); err == nil && listed == b {
		m.watch(b, conn)
		return
	}
	gone()
}

// discard destroys a sandbox that has no record: its session, container,
// layer, network and dir.
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
	errs = append(errs, rootfs.Unmount(ctx, filepath.Join(b.dir, layerDir)), m.detachNetwork(ctx, b.rec.ID))
	if err := errors.Join(errs...); err != nil {
		m.log.Error("destroying unlisted sandbox", "sandbox_id", b.rec.ID, "err", err)
		return
	}
	if err := os.RemoveAll(b.dir); err != nil {
		m.log.Error("removing unlisted sandbox dir", "sandbox_id", b.rec.ID, "err", err)
	}
}
