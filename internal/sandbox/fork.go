package sandbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"sync"
	"time"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// MaxForks is the most sandboxes one Fork makes.
const MaxForks = 16

// forkTmpPrefix names the dirs in the state dir that hold a fork's
// snapshot (checkpoint and layer image) while the forks are made.
const forkTmpPrefix = ".fork-"

// Fork makes count new sandboxes that continue from a running runsc
// sandbox's current state (memory, processes, files) and then diverge
// independently; the source keeps running. Each fork gets a new id, its
// own copy of the source's writable layer, the source's owner, template,
// limits, env and metadata, and the server's default timeout; q is the
// owner's quota, checked for each fork.
//
// The source is frozen while it is checkpointed (runsc checkpoint
// --leave-running) and its layer image copied, then thawed; the forks are
// restored from that image in parallel. Either all forks are made or none:
// a failure unwinds every fork made so far. The source is left running
// whatever happens (unless thawing it fails, which is returned).
func (im *Images) Fork(ctx context.Context, id ID, count int, q Quota) (_ []Sandbox, err error) {
	if count < 1 || count > MaxForks {
		return nil, fmt.Errorf("fork count %d outside [1, %d]: %w", count, MaxForks, errdefs.ErrInvalidArgument)
	}
	b, err := im.core.box(id)
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	tmp, err := os.MkdirTemp(im.cfg.StateDir, forkTmpPrefix)
	if err != nil {
		return nil, fmt.Errorf("creating fork dir: %w", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		} else {
			removeLater(im.log, tmp) // its name keeps the prefix gcForks cleans up
		}
	}()
	b.mu.Lock()
	tname, tbuild := b.rec.Template, b.rec.Build
	b.mu.Unlock()
	tmpl, err := im.cfg.templateOf(tname, tbuild)
	if err != nil {
		return nil, fmt.Errorf("template of sandbox %s: %w", id, err)
	}
	// Each fork's record, dir, layer and container are made while the
	// source is checkpointed (capture's ahead); only the restores wait
	// for the checkpoint.
	preps := make([]*prepared, count)
	perrs := make([]error, count)
	var pwg sync.WaitGroup
	src, early, err := im.capture(ctx, b, tmp, "forked", func(src Sandbox) {
		for i := range preps {
			pwg.Go(func() { preps[i], perrs[i] = im.core.prepareNew(ctx, forkRecord(src, im.cfg), tmpl, tmp, q, true) })
		}
	})
	pwg.Wait()
	if i := firstErr(perrs); err == nil && early && perrs[i] != nil {
		err = fmt.Errorf("forking sandbox %s: %w", id, perrs[i])
	}
	if err != nil || !early {
		// Not used: a failure, or a layer that changed under the
		// checkpoint (the forks are made from the new copy below).
		var undo cleanup
		for _, p := range preps {
			if p != nil {
				undo.take(&p.c)
			}
		}
		if uerr := undo.unwind(ctx); uerr != nil {
			im.log.Error("unwinding prepared forks", "sandbox_id", id, "err", uerr)
		}
		if err != nil {
			return nil, err
		}
	}
	t1 := time.Now()
	forks := make([]*box, count)
	errs := make([]error, count)
	var wg sync.WaitGroup
	for i := range forks {
		wg.Go(func() {
			if early {
				forks[i], errs[i] = im.core.finishNew(ctx, preps[i])
			} else {
				forks[i], errs[i] = im.core.restoreNew(ctx, forkRecord(src, im.cfg), tmpl, tmp, q)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		// A fork is all or nothing: the forks made go, records too.
		for _, f := range forks {
			if f == nil {
				continue
			}
			if uerr := im.core.retract(ctx, f.rec.ID, StateStopped, "fork failed"); uerr != nil {
				im.log.Error("unwinding failed fork", "sandbox_id", id, "err", uerr)
			}
		}
		return nil, fmt.Errorf("forking sandbox %s: %w", id, errs[firstErr(errs)])
	}
	out := make([]Sandbox, count)
	ids := make([]string, count)
	for i, f := range forks {
		f.mu.Lock()
		out[i] = f.rec
		f.mu.Unlock()
		ids[i] = f.rec.ID.String()
	}
	im.log.Info("sandbox forked", "sandbox_id", id, "forks", ids, "snapshot", t1.Sub(t0), "created_ahead", early, "total", time.Since(t0))
	return out, nil
}

func firstErr(errs []error) int {
	for i, e := range errs {
		if e != nil {
			return i
		}
	}
	return 0
}

// forkRecord is the record of a new fork of src: a new id, src's owner,
// template, runtime, limits, env and metadata, and the default timeout.
func forkRecord(src Sandbox, cfg Config) Sandbox {
	now := time.Now().UTC()
	rec := src
	rec.ID, rec.State, rec.Reason = NewID(), StateCreating, ""
	rec.Env, rec.Metadata = maps.Clone(src.Env), maps.Clone(src.Metadata)
	rec.Node, rec.CreatedAt = cfg.Node, now
	rec.Timeout = cfg.Limits.DefaultSandboxTimeout
	rec.ExpiresAt, rec.PausedAt = now.Add(rec.Timeout), time.Time{}
	return rec
}
