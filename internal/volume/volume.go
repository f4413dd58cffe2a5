// Package volume keeps persistent volumes on this node's disk: named
// directories owned by an API key that sandboxes mount at create and that
// outlive them. Each volume is an ext4 image, <data>/volumes/<id>/disk.img,
// loop-mounted on <data>/volumes/<id>/data (internal/rootfs): the image's
// size is the volume's quota, enforced by the kernel (a write past it gets
// ENOSPC, in the sandbox as on the host), and a key's volumes' sizes add
// up to at most its total quota. The records live in the store (Store);
// which sandboxes mount which volume too, so that a volume in use, by a
// running or a paused sandbox, cannot be deleted.
package volume

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"time"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/rootfs"
)

// Volume is the record of one volume.
type Volume struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"` // unique per owner
	Owner     string    `json:"owner,omitempty"`
	SizeBytes int64     `json:"size_bytes"`
	Node      string    `json:"node,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

// Store persists volume records and which sandboxes mount them. Both
// backends of internal/store implement it (storetest checks them).
type Store interface {
	// PutVolume inserts a record; errdefs.ErrAlreadyExists if its id, or
	// its name for its owner, is taken.
	PutVolume(ctx context.Context, v Volume) error
	// GetVolume returns the record of id; errdefs.ErrNotFound if none.
	GetVolume(ctx context.Context, id string) (Volume, error)
	// GetVolumeByName returns owner's volume called name;
	// errdefs.ErrNotFound if none.
	GetVolumeByName(ctx context.Context, owner, name string) (Volume, error)
	// ListVolumes returns owner's volumes, oldest first.
	ListVolumes(ctx context.Context, owner string) ([]Volume, error)
	// DeleteVolume removes a record; a missing one is not an error.
	DeleteVolume(ctx context.Context, id string) error
	// PutVolumeMounts records that sandbox mounts the volumes ids; the
	// rows go with the sandbox's record.
	PutVolumeMounts(ctx context.Context, sandbox string, ids []string) error
	// VolumeInUse reports whether a sandbox that has not ended (creating,
	// running, paused) mounts volume id.
	VolumeInUse(ctx context.Context, id string) (bool, error)
}

// Defaults for Config's zero fields.
const (
	DefaultSize  = 1 << 30  // a volume created without a size
	DefaultMax   = 64 << 30 // the largest volume
	DefaultQuota = 16 << 30 // all of one key's volumes
	// MinSize is the smallest volume: ext4 needs room for its metadata
	// and journal.
	MinSize = 16 << 20
)

// OwnerUID and OwnerGID own a new volume's root directory: the templates'
// "user", so that the default user can write a volume mounted read-write.
const (
	OwnerUID = 1000
	OwnerGID = 1000
)

// Config configures a Manager.
type Config struct {
	Dir   string // where the volumes live: <data>/volumes
	Store Store
	Node  string // this node's name in records (default: the hostname)
	// DefaultSize, MaxSize and Quota (per key, the sum of its volumes'
	// sizes) in bytes; 0 takes the defaults above.
	DefaultSize, MaxSize, Quota int64
	Log                         *slog.Logger
}

// Manager creates, finds, mounts and deletes volumes. Its lock orders
// every change of a volume against the binds of sandboxes to it: a
// volume is deleted only when no live sandbox is bound to it, and a bind
// fails if the volume is gone.
type Manager struct {
	cfg Config
	mu  sync.Mutex
}

// New makes cfg.Dir if needed.
func New(cfg Config) (*Manager, error) {
	if cfg.Store == nil || cfg.Dir == "" {
		return nil, errors.New("volume manager needs a store and a directory")
	}
	if cfg.DefaultSize == 0 {
		cfg.DefaultSize = DefaultSize
	}
	if cfg.MaxSize == 0 {
		cfg.MaxSize = DefaultMax
	}
	if cfg.Quota == 0 {
		cfg.Quota = DefaultQuota
	}
	cfg.DefaultSize = min(cfg.DefaultSize, cfg.MaxSize)
	if cfg.MaxSize < MinSize || cfg.Quota < MinSize {
		return nil, fmt.Errorf("volume sizes: the largest volume (%d) and the quota per key (%d) must be at least %d bytes: %w",
			cfg.MaxSize, cfg.Quota, MinSize, errdefs.ErrInvalidArgument)
	}
	if cfg.Node == "" {
		cfg.Node, _ = os.Hostname()
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating volume dir: %w", err)
	}
	return &Manager{cfg: cfg}, nil
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// ValidName checks a volume name: 1-63 letters, digits, '.', '_' or '-',
// starting with a letter or digit.
func ValidName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("volume name %q: want 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit: %w",
			clip(name), errdefs.ErrInvalidArgument)
	}
	return nil
}

// Create makes owner's volume name of size bytes (0: the default).
func (m *Manager) Create(ctx context.Context, owner, name string, size int64) (Volume, error) {
	if err := ValidName(name); err != nil {
		return Volume{}, err
	}
	if size == 0 {
		size = m.cfg.DefaultSize
	}
	if size < MinSize || size > m.cfg.MaxSize {
		return Volume{}, fmt.Errorf("volume size %d: want %d-%d bytes: %w", size, MinSize, m.cfg.MaxSize, errdefs.ErrInvalidArgument)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, err := m.cfg.Store.GetVolumeByName(ctx, owner, name); err == nil {
		return Volume{}, fmt.Errorf("volume %q: %w", name, errdefs.ErrAlreadyExists)
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return Volume{}, err
	}
	vols, err := m.cfg.Store.ListVolumes(ctx, owner)
	if err != nil {
		return Volume{}, err
	}
	var total int64
	for _, v := range vols {
		total += v.SizeBytes
	}
	if total+size > m.cfg.Quota {
		return Volume{}, fmt.Errorf("volume quota: %d of %d bytes taken, %d more asked: %w", total, m.cfg.Quota, size, errdefs.ErrResourceExhausted)
	}
	v := Volume{ID: newID(), Name: name, Owner: owner, SizeBytes: size, Node: m.cfg.Node, CreatedAt: time.Now().UTC().Truncate(time.Microsecond)}
	dir := m.dir(v.ID)
	if err := rootfs.MakeVolume(ctx, dir, size, OwnerUID, OwnerGID); err != nil {
		return Volume{}, fmt.Errorf("making volume: %w", err)
	}
	if err := m.cfg.Store.PutVolume(ctx, v); err != nil {
		if uerr := rootfs.Unmount(context.WithoutCancel(ctx), dir); uerr != nil {
			m.cfg.Log.Error("removing volume after a failed create", "volume_id", v.ID, "err", uerr)
		}
		return Volume{}, err
	}
	m.cfg.Log.Info("volume created", "volume_id", v.ID, "owner", owner, "size_bytes", size)
	return v, nil
}

// Get returns owner's volume ref: its id or, failing that, its name.
// Another owner's volume is errdefs.ErrNotFound.
func (m *Manager) Get(ctx context.Context, owner, ref string) (Volume, error) {
	return Lookup(ctx, m.cfg.Store, owner, ref)
}

// Lookup is Manager.Get on the records of st alone (a cluster front
// places a create by its volumes' node without holding any).
func Lookup(ctx context.Context, st Store, owner, ref string) (Volume, error) {
	v, err := st.GetVolume(ctx, ref)
	if err == nil && v.Owner == owner {
		return v, nil
	}
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return Volume{}, err
	}
	if nameRE.MatchString(ref) {
		if v, err := st.GetVolumeByName(ctx, owner, ref); err == nil || !errors.Is(err, errdefs.ErrNotFound) {
			return v, err
		}
	}
	return Volume{}, fmt.Errorf("volume %q: %w", clip(ref), errdefs.ErrNotFound)
}

// List returns owner's volumes, oldest first.
func (m *Manager) List(ctx context.Context, owner string) ([]Volume, error) {
	return m.cfg.Store.ListVolumes(ctx, owner)
}

// Delete removes owner's volume ref and its data. A volume a live sandbox
// mounts is errdefs.ErrFailedPrecondition.
func (m *Manager) Delete(ctx context.Context, owner, ref string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, err := m.Get(ctx, owner, ref)
	if err != nil {
		return err
	}
	inUse, err := m.cfg.Store.VolumeInUse(ctx, v.ID)
	if err != nil {
		return err
	}
	if inUse {
		return fmt.Errorf("volume %q is mounted by a sandbox that has not ended: %w", v.Name, errdefs.ErrFailedPrecondition)
	}
	if err := rootfs.Unmount(ctx, m.dir(v.ID)); err != nil {
		return fmt.Errorf("removing volume %s: %w", v.ID, err)
	}
	if err := m.cfg.Store.DeleteVolume(ctx, v.ID); err != nil {
		return err
	}
	m.cfg.Log.Info("volume deleted", "volume_id", v.ID, "owner", owner)
	return nil
}

// Bind resolves refs (ids or names of owner's volumes) for sandbox, whose
// record exists, records the binding and returns the host directories to
// mount, in order. A ref that names no volume of owner's is
// errdefs.ErrInvalidArgument (the create request is wrong).
func (m *Manager) Bind(ctx context.Context, owner, sandbox string, refs []string) ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ids := make([]string, len(refs))
	dirs := make([]string, len(refs))
	for i, ref := range refs {
		v, err := m.Get(ctx, owner, ref)
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil, fmt.Errorf("volume %q: no such volume: %w", clip(ref), errdefs.ErrInvalidArgument)
		}
		if err != nil {
			return nil, err
		}
		if err := m.mount(v.ID); err != nil {
			return nil, err
		}
		ids[i], dirs[i] = v.ID, rootfs.VolumeData(m.dir(v.ID))
	}
	if err := m.cfg.Store.PutVolumeMounts(ctx, sandbox, ids); err != nil {
		return nil, err
	}
	return dirs, nil
}

// Data returns the host directory of owner's volume ref, mounted, for the
// volume content API (files.go).
func (m *Manager) Data(ctx context.Context, owner, ref string) (Volume, string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, err := m.Get(ctx, owner, ref)
	if err != nil {
		return Volume{}, "", err
	}
	if err := m.mount(v.ID); err != nil {
		return Volume{}, "", err
	}
	return v, rootfs.VolumeData(m.dir(v.ID)), nil
}

// mount makes sure the image of volume id is mounted (after a reboot it
// is not).
func (m *Manager) mount(id string) error {
	if err := rootfs.MountVolume(m.dir(id)); err != nil {
		return fmt.Errorf("mounting volume %s: %w", id, err)
	}
	return nil
}

func (m *Manager) dir(id string) string { return filepath.Join(m.cfg.Dir, id) }

// newID returns a new volume id: "vol-" and 16 random hex digits.
func newID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "vol-" + hex.EncodeToString(b)
}

// clip shortens s for an error message.
func clip(s string) string {
	const n = 64
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
