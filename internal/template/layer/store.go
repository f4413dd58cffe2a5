package layer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// Store keeps published layers under a directory:
//
//	layers/<key>/root        a layer (an overlay lowerdir)
//	layers/<key>/layer.json  its Info
//	tmp/<name>/              publishes in progress and layers being deleted
//	lock                     taken shared by Publish and Acquire, exclusively by GC
//
// A layer is filled in tmp, synced (syncfs) and renamed into layers/ in one
// step, so after a crash (kill -9 at any point) a key names either a
// complete layer or nothing; what is left in tmp is removed by the next
// Open or GC. Leases are flock(2) locks, shared, on a layer's directory;
// they hold across processes (a local build and kiln serve on one data
// dir) and vanish with the process that held them. GC removes a layer
// only when it can lock it exclusively, and in-progress publishes hold
// their tmp dir locked the same way.
type Store struct {
	dir string
}

// Info describes a published layer.
type Info struct {
	Key string `json:"key"`
	// Size is the layer's disk usage in bytes (allocated blocks, each
	// inode once).
	Size    int64     `json:"size"`
	Created time.Time `json:"created"`
}

const (
	layersDir = "layers"
	tmpDir    = "tmp"
	lockName  = "lock"
	infoName  = "layer.json"
	rootName  = "root"
)

var keyRE = regexp.MustCompile(`^[0-9a-f]{32,128}$`)

func checkKey(key string) error {
	if !keyRE.MatchString(key) {
		return fmt.Errorf("layer key %q: want lowercase hex: %w", clipKey(key), errdefs.ErrInvalidArgument)
	}
	return nil
}

func clipKey(key string) string {
	if len(key) > 80 {
		return key[:80] + "…"
	}
	return key
}

// Open opens (creating) the store under dir and removes what interrupted
// publishes and collections left in it.
func Open(dir string) (*Store, error) {
	s := &Store{dir: dir}
	for _, d := range []string{dir, s.path(layersDir), s.path(tmpDir)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("creating layer store: %w", err)
		}
	}
	f, err := os.OpenFile(s.path(lockName), os.O_RDONLY|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("creating layer store lock: %w", err)
	}
	f.Close()
	if _, err := s.cleanTmp(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Store) path(p ...string) string {
	return filepath.Join(append([]string{s.dir}, p...)...)
}

// lockStore takes the store lock, shared or exclusive; closing the file
// releases it.
func (s *Store) lockStore(how int) (*os.File, error) {
	f, err := os.Open(s.path(lockName))
	if err != nil {
		return nil, fmt.Errorf("opening layer store lock: %w", err)
	}
	if err := flock(f, how); err != nil {
		f.Close()
		return nil, fmt.Errorf("locking layer store: %w", err)
	}
	return f, nil
}

func flock(f *os.File, how int) error {
	for {
		err := unix.Flock(int(f.Fd()), how)
		if err != unix.EINTR {
			return err
		}
	}
}

// Pending is a layer being made: fill Dir, then Publish or Discard it.
type Pending struct {
	s    *Store
	dir  string
	lock *os.File // holds dir locked exclusively until published or discarded
}

// Create starts a new layer in the store's tmp dir.
func (s *Store) Create() (*Pending, error) {
	var err error
	for range 3 { // a GC may clean the dir between its making and its lock
		var p *Pending
		if p, err = s.create(); err == nil {
			return p, nil
		}
	}
	return nil, fmt.Errorf("creating layer: %w", err)
}

func (s *Store) create() (*Pending, error) {
	dir, err := os.MkdirTemp(s.path(tmpDir), "new-")
	if err != nil {
		return nil, err
	}
	f, err := os.Open(dir)
	if err == nil {
		if err = flock(f, unix.LOCK_EX); err != nil {
			f.Close()
		}
	}
	if err == nil {
		// Fails if a GC removed dir before the lock was taken.
		if err = os.Mkdir(filepath.Join(dir, rootName), 0o755); err != nil {
			f.Close()
		}
	}
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return &Pending{s: s, dir: dir, lock: f}, nil
}

// Dir is the directory to fill: the root of the layer.
func (p *Pending) Dir() string { return filepath.Join(p.dir, rootName) }

// Discard removes the unpublished layer.
func (p *Pending) Discard() error {
	if p.lock == nil {
		return nil
	}
	err := os.RemoveAll(p.dir)
	p.lock.Close()
	p.lock = nil
	if err != nil {
		return fmt.Errorf("discarding layer: %w", err)
	}
	return nil
}

// Publish makes the layer durable and visible under key and returns it
// leased. When key is already published (a concurrent build of the same
// step), this layer is discarded and the existing one returned: one key,
// one layer.
func (p *Pending) Publish(ctx context.Context, key string) (*Layer, error) {
	if err := checkKey(key); err != nil {
		p.Discard()
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		p.Discard()
		return nil, err
	}
	if l, err := p.s.Acquire(key); err == nil {
		p.Discard()
		return l, nil
	}
	size, err := diskUsage(p.Dir())
	if err == nil {
		err = writeInfo(filepath.Join(p.dir, infoName), Info{Key: key, Size: size, Created: time.Now().UTC()})
	}
	if err == nil {
		// Everything in the layer reaches the disk before its name does.
		err = unix.Syncfs(int(p.lock.Fd()))
	}
	if err != nil {
		p.Discard()
		return nil, fmt.Errorf("publishing layer: %w", err)
	}
	slock, err := p.s.lockStore(unix.LOCK_SH)
	if err != nil {
		p.Discard()
		return nil, err
	}
	defer slock.Close()
	final := p.s.path(layersDir, key)
	err = os.Rename(p.dir, final)
	if errors.Is(err, syscall.EEXIST) || errors.Is(err, syscall.ENOTEMPTY) {
		p.Discard()
		return p.s.acquireLocked(key)
	}
	if err != nil {
		p.Discard()
		return nil, fmt.Errorf("publishing layer: %w", err)
	}
	// GC cannot run (store lock), so dropping the exclusive lock before
	// taking the lease is safe.
	p.lock.Close()
	p.lock = nil
	if err := syncDir(p.s.path(layersDir)); err != nil {
		return nil, fmt.Errorf("publishing layer: %w", err)
	}
	return p.s.acquireLocked(key)
}

// Layer is a published layer, leased: GC keeps it until Release.
type Layer struct {
	info Info
	dir  string
	f    *os.File
}

// Key is the layer's key.
func (l *Layer) Key() string { return l.info.Key }

// Dir is the layer's root, to use as an overlay lowerdir.
func (l *Layer) Dir() string { return filepath.Join(l.dir, rootName) }

// Info describes the layer.
func (l *Layer) Info() Info { return l.info }

// Release ends the lease. The layer stays until a GC that does not keep it.
func (l *Layer) Release() error {
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

// Acquire leases the layer published under key; ErrNotFound if there is
// none.
func (s *Store) Acquire(key string) (*Layer, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	slock, err := s.lockStore(unix.LOCK_SH)
	if err != nil {
		return nil, err
	}
	defer slock.Close()
	return s.acquireLocked(key)
}

// acquireLocked is Acquire under the store lock, which keeps GC out.
func (s *Store) acquireLocked(key string) (*Layer, error) {
	dir := s.path(layersDir, key)
	f, err := os.Open(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("layer %s: %w", key, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("opening layer: %w", err)
	}
	if err := flock(f, unix.LOCK_SH); err != nil {
		f.Close()
		return nil, fmt.Errorf("leasing layer: %w", err)
	}
	info, err := readInfo(filepath.Join(dir, infoName))
	if err != nil {
		f.Close()
		return nil, err
	}
	return &Layer{info: info, dir: dir, f: f}, nil
}

// Stat describes the layer published under key without leasing it.
func (s *Store) Stat(key string) (Info, error) {
	if err := checkKey(key); err != nil {
		return Info{}, err
	}
	info, err := readInfo(s.path(layersDir, key, infoName))
	if errors.Is(err, fs.ErrNotExist) {
		return Info{}, fmt.Errorf("layer %s: %w", key, errdefs.ErrNotFound)
	}
	return info, err
}

// GCResult says what a GC did.
type GCResult struct {
	Removed int   // layers removed
	Freed   int64 // their Size, summed
	Leased  int   // unreferenced layers kept because they are leased
}

// GC removes every published layer that keep does not report (keep may be
// nil: nothing is referenced) and that no one leases, and what interrupted
// publishes left behind. The caller passes the keys its templates and
// builds reference; a build must keep the layers it made leased until the
// template that references them is recorded.
func (s *Store) GC(ctx context.Context, keep func(key string) bool) (GCResult, error) {
	var res GCResult
	doomed, err := s.unpublish(keep, &res)
	for _, f := range doomed {
		if err == nil {
			err = ctx.Err()
		}
		if err == nil {
			if rerr := os.RemoveAll(f.Name()); rerr != nil {
				err = fmt.Errorf("removing layer: %w", rerr)
			}
		}
		f.Close() // a layer left half-removed is in tmp: the next GC finishes it
	}
	if err != nil {
		return res, err
	}
	if _, err := s.cleanTmp(); err != nil {
		return res, err
	}
	return res, nil
}

// lockedDir is a directory held locked by f.
type lockedDir struct {
	f    *os.File
	path string
}

func (d *lockedDir) Name() string { return d.path }
func (d *lockedDir) Close() error { return d.f.Close() }

// unpublish moves the unreferenced, unleased layers into tmp under the
// exclusive store lock and returns them, still locked.
func (s *Store) unpublish(keep func(string) bool, res *GCResult) ([]*lockedDir, error) {
	slock, err := s.lockStore(unix.LOCK_EX)
	if err != nil {
		return nil, err
	}
	defer slock.Close()
	ents, err := os.ReadDir(s.path(layersDir))
	if err != nil {
		return nil, fmt.Errorf("listing layers: %w", err)
	}
	var doomed []*lockedDir
	for _, e := range ents {
		key := e.Name()
		if keyRE.MatchString(key) && keep != nil && keep(key) {
			continue
		}
		f, err := os.Open(s.path(layersDir, key))
		if err != nil {
			return doomed, fmt.Errorf("opening layer: %w", err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			res.Leased++
			continue
		}
		info, _ := readInfo(s.path(layersDir, key, infoName))
		// The locked directory moves to tmp under a fresh name: its lock
		// keeps other collectors' cleanTmp off it.
		trash := s.path(tmpDir, "gc-"+clipKey(key)+"-"+strconv.FormatInt(time.Now().UnixNano(), 36))
		if err := os.Rename(s.path(layersDir, key), trash); err != nil {
			f.Close()
			return doomed, fmt.Errorf("unpublishing layer: %w", err)
		}
		doomed = append(doomed, &lockedDir{f, trash})
		res.Removed++
		res.Freed += info.Size
	}
	return doomed, syncDir(s.path(layersDir))
}

// cleanTmp removes every entry of tmp that no one holds locked: what an
// interrupted publish or GC left.
func (s *Store) cleanTmp() (int, error) {
	ents, err := os.ReadDir(s.path(tmpDir))
	if err != nil {
		return 0, fmt.Errorf("listing layer store tmp: %w", err)
	}
	n := 0
	for _, e := range ents {
		p := s.path(tmpDir, e.Name())
		f, err := os.Open(p)
		if err != nil {
			continue // removed meanwhile
		}
		if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
			f.Close()
			continue // a publish or GC in progress
		}
		err = os.RemoveAll(p)
		f.Close()
		if err != nil {
			return n, fmt.Errorf("removing leftover %s: %w", e.Name(), err)
		}
		n++
	}
	return n, nil
}

func writeInfo(p string, info Info) error {
	b, err := json.Marshal(info)
	if err != nil {
		return err
	}
	return os.WriteFile(p, b, 0o600)
}

func readInfo(p string) (Info, error) {
	var info Info
	b, err := os.ReadFile(p)
	if err != nil {
		return info, fmt.Errorf("reading layer info: %w", err)
	}
	if err := json.Unmarshal(b, &info); err != nil {
		return info, fmt.Errorf("reading layer info: %w", err)
	}
	return info, nil
}

func syncDir(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// diskUsage sums the allocated size of everything under dir, counting each
// inode once.
func diskUsage(dir string) (int64, error) {
	seen := map[uint64]bool{}
	var total int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		if st.Nlink > 1 && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			if seen[st.Ino] {
				return nil
			}
			seen[st.Ino] = true
		}
		total += st.Blocks * 512
		return nil
	})
	return total, err
}
