package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"syscall"
	"time"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/oci"
)

// Snapshot is the record of a named snapshot: the image (checkpoint and
// layer copy, see capture) of a running runsc sandbox, from which new
// sandboxes can be made. Its files live in the snapshot dir under ID.
type Snapshot struct {
	ID        string            `json:"id"`
	Name      string            `json:"name"` // unique per owner
	Owner     string            `json:"owner,omitempty"`
	Source    ID                `json:"source"` // the sandbox it was taken of
	Template  string            `json:"template"`
	Build     string            `json:"build,omitempty"` // the custom template build of its source
	Runtime   string            `json:"runtime"`
	Limits    Limits            `json:"limits"`
	User      string            `json:"user"`
	Workdir   string            `json:"workdir"`
	Env       map[string]string `json:"env,omitempty"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	SizeBytes int64             `json:"size_bytes"` // disk used by its files
	Node      string            `json:"node,omitempty"`
	CreatedAt time.Time         `json:"created_at"`
	// Image is its image in the shared snapshot dir, as Sandbox.Image
	// ("" for one in its node's data dir): any node can restore it.
	Image string `json:"image,omitempty"`
}

var snapshotNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// ValidSnapshotName checks a snapshot name from a caller: 1-64 letters,
// digits, '.', '_' or '-', starting with a letter or digit.
func ValidSnapshotName(name string) error {
	if !snapshotNameRE.MatchString(name) {
		return fmt.Errorf("snapshot name %q: want 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit: %w",
			truncateName(name), errdefs.ErrInvalidArgument)
	}
	return nil
}

func truncateName(s string) string {
	if len(s) > 70 {
		return s[:70] + "…"
	}
	return s
}

// snapshotDir holds one dir per snapshot: DataDir/snapshots for kiln
// serve (whose state dir is DataDir/sandboxes); inside the state dir for
// private Managers (kiln run, kiln bench, tests), so that theirs go with
// it.
func (im *Images) snapshotDir() string {
	if im.cfg.StateDir == filepath.Join(im.cfg.DataDir, "sandboxes") {
		return filepath.Join(im.cfg.DataDir, "snapshots")
	}
	return filepath.Join(im.cfg.StateDir, ".snapshots")
}

// Snapshot takes a named snapshot of a running runsc sandbox, which keeps
// running (it is frozen for about as long as a fork's snapshot). The
// snapshot belongs to the sandbox's owner, whose limits on the number and
// total size of snapshots (KILN_MAX_SNAPSHOTS, KILN_MAX_SNAPSHOT_BYTES)
// are checked before and after the image is taken.
func (im *Images) Snapshot(ctx context.Context, id ID, name string) (_ Snapshot, err error) {
	if err := ValidSnapshotName(name); err != nil {
		return Snapshot{}, err
	}
	b, err := im.core.box(id)
	if err != nil {
		return Snapshot{}, err
	}
	b.mu.Lock()
	owner := b.rec.Owner
	_, _, err = im.capturable(b.rec, "snapshotted")
	b.mu.Unlock()
	if err != nil {
		return Snapshot{}, err
	}
	if err := im.checkRetention(ctx, owner, name, 0); err != nil {
		return Snapshot{}, err
	}
	t0 := time.Now()
	snapID := NewID().String()
	dir := filepath.Join(im.snapshotDir(), snapID)
	shared := im.cfg.Cluster.SnapshotDir
	if shared != "" {
		// Written in a temp dir of this node's, moved into place sealed.
		if dir, err = newSharedTemp(shared, im.cfg.Node); err != nil {
			return Snapshot{}, err
		}
	} else if err := os.MkdirAll(dir, 0o700); err != nil {
		return Snapshot{}, fmt.Errorf("creating snapshot dir: %w", err)
	}
	defer func() {
		if err != nil {
			if rerr := os.RemoveAll(dir); rerr != nil {
				im.log.Error("removing failed snapshot", "snapshot_id", snapID, "err", rerr)
			}
		}
	}()
	src, _, err := im.capture(ctx, b, dir, "snapshotted", nil)
	if errors.Is(err, errdefs.ErrResourceExhausted) {
		return Snapshot{}, fmt.Errorf("the server's disk is full: %w", err)
	}
	if err != nil {
		return Snapshot{}, err
	}
	t1 := time.Now()
	for _, d := range []string{filepath.Join(dir, imageCheckpoint), dir} {
		if err := syncDir(d); err != nil {
			return Snapshot{}, fmt.Errorf("syncing snapshot: %w", err)
		}
	}
	size, err := diskUsage(dir)
	if err != nil {
		return Snapshot{}, fmt.Errorf("measuring snapshot: %w", err)
	}
	snap := Snapshot{
		ID: snapID, Name: name, Owner: owner, Source: src.ID, Template: src.Template, Build: src.Build, Runtime: src.Runtime,
		Limits: src.Limits, User: src.User, Workdir: src.Workdir, Env: src.Env, Metadata: src.Metadata,
		SizeBytes: size, Node: im.cfg.Node, CreatedAt: time.Now().UTC(),
	}
	if shared != "" {
		if snap.Image, err = sealImage(dir, shared, sharedSnapshots+"/"+snapID); err != nil {
			return Snapshot{}, fmt.Errorf("storing snapshot in the shared snapshot dir: %w", err)
		}
		dir = imageDir(shared, snap.Image) // removed if the record cannot be written
	}
	// Checked again with the real size; the lock makes check-and-record
	// one step, so concurrent snapshots cannot both squeeze in.
	im.snapMu.Lock()
	defer im.snapMu.Unlock()
	if err := im.checkRetention(ctx, owner, name, size); err != nil {
		return Snapshot{}, err
	}
	if err := im.records.PutSnapshot(ctx, snap); err != nil {
		return Snapshot{}, fmt.Errorf("recording snapshot: %w", err)
	}
	im.log.Info("snapshot taken", "sandbox_id", id, "snapshot", name, "snapshot_id", snapID,
		"bytes", size, "image", t1.Sub(t0), "total", time.Since(t0))
	return snap, nil
}

// snapshotFiles is the dir of snap's files: in the shared snapshot dir,
// or this node's.
func (im *Images) snapshotFiles(snap Snapshot) string {
	if snap.Image != "" {
		return imageDir(im.cfg.Cluster.SnapshotDir, snap.Image)
	}
	return filepath.Join(im.snapshotDir(), snap.ID)
}

// checkRetention refuses a new snapshot named name of size bytes (0:
// not known yet) that owner may not keep.
func (im *Images) checkRetention(ctx context.Context, owner, name string, size int64) error {
	snaps, err := im.records.ListSnapshots(ctx, owner)
	if err != nil {
		return fmt.Errorf("listing snapshots: %w", err)
	}
	var total int64
	for _, s := range snaps {
		if s.Name == name {
			return fmt.Errorf("snapshot %q exists; delete it first or pick another name: %w", name, errdefs.ErrAlreadyExists)
		}
		total += s.SizeBytes
	}
	l := im.cfg.Limits
	if l.MaxSnapshots > 0 && len(snaps) >= l.MaxSnapshots {
		return fmt.Errorf("snapshot limit: at most %d snapshots per key; delete one first: %w", l.MaxSnapshots, errdefs.ErrResourceExhausted)
	}
	if l.MaxSnapshotBytes > 0 && (total+size > l.MaxSnapshotBytes || total >= l.MaxSnapshotBytes) {
		return fmt.Errorf("snapshot limit: at most %s of snapshots per key (%s in use, this one %s); delete some first: %w",
			mib(l.MaxSnapshotBytes), mib(total), mib(size), errdefs.ErrResourceExhausted)
	}
	return nil
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// Snapshots lists owner's snapshots, oldest first ("" lists every owner's).
func (im *Images) Snapshots(ctx context.Context, owner string) ([]Snapshot, error) {
	return im.records.ListSnapshots(ctx, owner)
}

// GetSnapshot returns owner's snapshot called name.
func (im *Images) GetSnapshot(ctx context.Context, owner, name string) (Snapshot, error) {
	if err := ValidSnapshotName(name); err != nil {
		return Snapshot{}, err
	}
	return im.records.GetSnapshot(ctx, owner, name)
}

// DeleteSnapshot deletes owner's snapshot called name: its record, then
// its files. Sandboxes made from it are not affected. It waits for
// restores from snapshots in progress.
func (im *Images) DeleteSnapshot(ctx context.Context, owner, name string) error {
	snap, err := im.GetSnapshot(ctx, owner, name)
	if err != nil {
		return err
	}
	im.snapMu.Lock()
	defer im.snapMu.Unlock()
	if err := im.records.DeleteSnapshot(ctx, snap.ID); err != nil {
		return fmt.Errorf("deleting snapshot record: %w", err)
	}
	// The record is gone: if kiln serve stops before the files are, the
	// next start's GC removes them.
	if dir := im.snapshotFiles(snap); dir != "" {
		removeLater(im.log, dir)
	}
	im.log.Info("snapshot deleted", "snapshot", name, "snapshot_id", snap.ID, "bytes", snap.SizeBytes)
	return nil
}

// SnapshotStats is what this node's snapshots hold, for metrics.
type SnapshotStats struct {
	Count int
	Bytes int64
}

// SnapshotStats counts this node's snapshots and their bytes on disk.
func (im *Images) SnapshotStats(ctx context.Context) (SnapshotStats, error) {
	snaps, err := im.records.ListSnapshots(ctx, "")
	if err != nil {
		return SnapshotStats{}, err
	}
	var st SnapshotStats
	for _, s := range snaps {
		if s.Node == im.cfg.Node {
			st.Count++
			st.Bytes += s.SizeBytes
		}
	}
	return st, nil
}

// fromSnapshot makes a sandbox from owner's snapshot opts.Snapshot:
// a restored copy of it with its own id, hostname, cgroup, disk and
// environment (the snapshot's, overlaid with opts.Env). The snapshot
// fixes template, runtime and limits. It is part of the image seam: the
// Manager's Create hands it every create from a snapshot.
func (im *Images) fromSnapshot(ctx context.Context, opts CreateOptions) (Sandbox, error) {
	name := opts.Snapshot
	snap, err := im.GetSnapshot(ctx, opts.Owner, name)
	if err != nil {
		return Sandbox{}, err
	}
	switch {
	case opts.Template != "" && opts.Template != snap.Template:
		return Sandbox{}, fmt.Errorf("snapshot %q is of template %s, not %s: %w", name, snap.Template, opts.Template, errdefs.ErrInvalidArgument)
	case opts.Runtime != "" && opts.Runtime != snap.Runtime:
		return Sandbox{}, fmt.Errorf("snapshot %q runs on %s, not %s: %w", name, snap.Runtime, opts.Runtime, errdefs.ErrInvalidArgument)
	case opts.Limits != (Limits{}) && opts.Limits != snap.Limits:
		return Sandbox{}, fmt.Errorf("a sandbox made from snapshot %q has its limits; leave limits unset: %w", name, errdefs.ErrInvalidArgument)
	case networkRequested(opts.Network):
		return Sandbox{}, fmt.Errorf("a sandbox made from snapshot %q has the snapshot's network; leave network unset and change its policy once it runs: %w", name, errdefs.ErrInvalidArgument)
	}
	timeout, err := im.checkRequest(opts)
	if err != nil {
		return Sandbox{}, err
	}
	ck, ok := im.runtimes[snap.Runtime].(oci.Checkpointer)
	if !ok || !ck.CanCheckpoint() {
		return Sandbox{}, fmt.Errorf("snapshot %q needs runtime %s with checkpoint/restore, which this server lacks: %w", name, snap.Runtime, errdefs.ErrFailedPrecondition)
	}
	tmpl, err := im.cfg.templateOf(snap.Template, snap.Build)
	if err != nil {
		return Sandbox{}, fmt.Errorf("template %s of snapshot %q: %w: %w", snap.Template, name, errdefs.ErrFailedPrecondition, err)
	}

	now := time.Now().UTC()
	env := maps.Clone(snap.Env)
	if env == nil {
		env = map[string]string{}
	}
	maps.Copy(env, opts.Env)
	meta := maps.Clone(snap.Metadata)
	if len(opts.Metadata) > 0 && meta == nil {
		meta = map[string]string{}
	}
	maps.Copy(meta, opts.Metadata)
	if err := validateMetadata(meta); err != nil {
		return Sandbox{}, fmt.Errorf("snapshot %q's metadata with the request's: %w", name, err)
	}
	rec := Sandbox{
		ID: NewID(), Template: snap.Template, Build: snap.Build, Runtime: snap.Runtime, State: StateCreating,
		Limits: snap.Limits, User: snap.User, Workdir: snap.Workdir, Env: env, Metadata: meta,
		Owner: opts.Owner, Node: im.cfg.Node, CreatedAt: now, ExpiresAt: now.Add(timeout),
		Timeout: timeout, AutoPause: opts.AutoPause, AutoResume: opts.AutoResume,
	}
	im.snapMu.RLock()
	defer im.snapMu.RUnlock()
	dir := filepath.Join(im.snapshotDir(), snap.ID)
	if snap.Image != "" {
		t0 := time.Now()
		if dir, err = openImage(im.cfg.Cluster.SnapshotDir, snap.Image, imageBound(snap.Limits), snap.Node != im.cfg.Node); err != nil {
			im.log.Error("snapshot in the shared snapshot dir cannot be used", "snapshot_id", snap.ID, "err", err)
			return Sandbox{}, fmt.Errorf("snapshot %q: %w", name, err)
		}
		im.log.Info("snapshot image checked", "snapshot_id", snap.ID, "took", time.Since(t0))
	}
	for f, what := range map[string]string{filepath.Join(imageCheckpoint, checkpointImage): "memory image", imageDisk: "disk image"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			im.log.Error("snapshot is damaged", "snapshot_id", snap.ID, "missing", f, "err", err)
			return Sandbox{}, fmt.Errorf("snapshot %q is damaged (its %s is missing); delete it: %w", name, what, errdefs.ErrFailedPrecondition)
		}
	}
	t0 := time.Now()
	b, err := im.core.restoreNew(ctx, rec, tmpl, dir, opts.Quota)
	if err != nil {
		if classified(err) {
			return Sandbox{}, err
		}
		im.log.Error("restoring snapshot", "snapshot_id", snap.ID, "err", err)
		return Sandbox{}, fmt.Errorf("snapshot %q could not be restored; it may be damaged: %w", name, errdefs.ErrFailedPrecondition)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	im.log.Info("sandbox created from snapshot", "sandbox_id", rec.ID, "snapshot", name, "took", time.Since(t0))
	return b.rec, nil
}

// checkRequest validates a create request's env, metadata and timeout,
// and resolves the timeout.
func (im *Images) checkRequest(opts CreateOptions) (time.Duration, error) {
	if err := validateRecordVars(opts.Env, opts.Metadata); err != nil {
		return 0, err
	}
	return im.cfg.timeout(opts.Timeout)
}

// networkRequested reports whether a create asks for any network setting.
func networkRequested(n *NetworkOptions) bool {
	if n == nil {
		return false
	}
	p := n.Policy
	return n.Mode != "" || n.Public || p.Egress != "" || len(p.Allow) > 0 || len(p.Deny) > 0 ||
		p.BandwidthBytes != 0 || p.MaxConnections != 0
}

// classified reports whether err carries one of the errdefs classes.
func classified(err error) bool {
	for _, c := range []error{errdefs.ErrNotFound, errdefs.ErrAlreadyExists, errdefs.ErrInvalidArgument,
		errdefs.ErrFailedPrecondition, errdefs.ErrResourceExhausted, errdefs.ErrUnauthenticated,
		errdefs.ErrPermissionDenied, errdefs.ErrUnavailable, errdefs.ErrDeadlineExceeded} {
		if errors.Is(err, c) {
			return true
		}
	}
	return false
}

// gcSnapshots reconciles this node's snapshot records with the snapshot
// dir at start: dirs with no record (a snapshot interrupted by a crash, or
// deleted while its files could not be removed) are removed, records
// whose files are gone are deleted.
func (im *Images) gcSnapshots(ctx context.Context) error {
	snaps, err := im.records.ListSnapshots(ctx, "")
	if err != nil {
		return fmt.Errorf("listing snapshots: %w", err)
	}
	known := map[string]bool{}
	for _, s := range snaps {
		if s.Node != im.cfg.Node || s.Image != "" { // a shared one's files are not here
			continue
		}
		known[s.ID] = true
		dir := filepath.Join(im.snapshotDir(), s.ID)
		if _, err := os.Stat(filepath.Join(dir, imageDisk)); errors.Is(err, fs.ErrNotExist) {
			im.log.Warn("deleting snapshot record whose files are gone", "snapshot", s.Name, "snapshot_id", s.ID, "owner", s.Owner)
			if err := im.records.DeleteSnapshot(ctx, s.ID); err != nil {
				return fmt.Errorf("deleting snapshot record: %w", err)
			}
		}
	}
	ents, err := os.ReadDir(im.snapshotDir())
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("listing snapshot dirs: %w", err)
	}
	for _, e := range ents {
		if known[e.Name()] {
			continue
		}
		im.log.Warn("removing snapshot files with no record", "snapshot_id", e.Name())
		if err := os.RemoveAll(filepath.Join(im.snapshotDir(), e.Name())); err != nil {
			im.log.Error("removing orphaned snapshot files", "snapshot_id", e.Name(), "err", err)
		}
	}
	return nil
}

// syncDir flushes the files of dir and dir itself to disk, so that a
// snapshot survives a host crash.
func syncDir(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range append(ents, nil) {
		p := dir
		if e != nil {
			p = filepath.Join(dir, e.Name())
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		err = f.Sync()
		f.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// diskUsage is the disk space the files under dir take (their allocated
// blocks: a sparse image counts only its data).
func diskUsage(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			n += st.Blocks * 512
		}
		return nil
	})
	return n, err
}
