package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// Warm is a template's warm step: what runs in a freshly booted sandbox
// before it is checkpointed, so that sandboxes made from the template start
// from that point (kernel up, imports done) instead of booting.
type Warm struct {
	// Code runs in the default context of Language, whose kernel starts
	// first.
	Language string `json:"language,omitempty"`
	Code     string `json:"code,omitempty"`
	// Start is a shell command left running in the background, e.g. a
	// server; Ready is a shell command retried until it exits 0, e.g. a
	// health check of what Start started.
	Start string `json:"start,omitempty"`
	Ready string `json:"ready,omitempty"`
	// Cwd is where Start and Ready run ("": the user's home): a custom
	// template's working directory, where Docker runs a CMD and E2B a
	// start command.
	Cwd string `json:"cwd,omitempty"`
	// TimeoutSeconds bounds the whole warm step; 0 means DefaultWarmTimeout.
	TimeoutSeconds int `json:"timeout_seconds,omitempty"`
}

// DefaultWarmTimeout bounds a warm step that sets no timeout.
const DefaultWarmTimeout = 2 * time.Minute

// Timeout is how long the warm step may take.
func (w *Warm) Timeout() time.Duration {
	if w.TimeoutSeconds > 0 {
		return time.Duration(w.TimeoutSeconds) * time.Second
	}
	return DefaultWarmTimeout
}

// Key identifies a warm checkpoint of the step taken with the given
// environment (runtime version, agent build, ...): a checkpoint is only
// usable by a host whose environment is the same.
func (w *Warm) Key(env ...string) string {
	b, _ := json.Marshal(struct {
		W   *Warm
		Env []string
	}{w, env})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// Checkpoint is a stored warm checkpoint of a template build: the memory
// image of a sandbox that ran the warm step and a copy of its writable
// layer. Its manifest (warm.json) is written last, so its presence marks
// the checkpoint complete.
type Checkpoint struct {
	Key       string    `json:"key"`
	Runtime   string    `json:"runtime"` // the runtime's version
	Agent     string    `json:"agent"`   // the agent build's hash
	Limits    Limits    `json:"limits"`  // of the sandbox that was checkpointed
	CreatedAt time.Time `json:"created_at"`
	Took      string    `json:"took"` // how long the warm build took
	Dir       string    `json:"-"`
}

// Limits are the limits a warm checkpoint was taken with, in the units of
// sandbox.Limits.
type Limits struct {
	CPUs        float64 `json:"cpus"`
	MemoryBytes int64   `json:"memory_bytes"`
	DiskBytes   int64   `json:"disk_bytes"`
	Pids        int64   `json:"pids"`
}

// Image is the checkpoint's memory image dir; Disk its layer image.
func (c *Checkpoint) Image() string { return filepath.Join(c.Dir, "checkpoint") }
func (c *Checkpoint) Disk() string  { return filepath.Join(c.Dir, "disk.img") }

const (
	warmDirName      = "warm"
	warmManifestName = "warm.json"
	warmBuildPrefix  = ".building-"
	// keepCheckpoints is how many warm checkpoints of one template build
	// are kept (one per agent build / runtime version in use, e.g. the
	// installed kiln's and the tests').
	keepCheckpoints = 3
)

// Checkpoint returns the template's warm checkpoint with key, or an
// fs.ErrNotExist error.
func (t *Template) Checkpoint(key string) (*Checkpoint, error) {
	dir := filepath.Join(t.Dir, warmDirName, key)
	b, err := os.ReadFile(filepath.Join(dir, warmManifestName))
	if err != nil {
		return nil, err
	}
	var c Checkpoint
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("decoding warm checkpoint manifest %s: %w", dir, err)
	}
	if c.Key != key {
		return nil, fmt.Errorf("warm checkpoint %s has key %q: %w", dir, c.Key, fs.ErrNotExist)
	}
	c.Dir = dir
	return &c, nil
}

// LockWarm takes an exclusive lock on the build's warm checkpoints, held
// across processes (flock), so that concurrent builders (kiln serve, kiln
// template build, tests) build a checkpoint once: the second finds it.
// It waits until the lock is free or ctx is done.
func (t *Template) LockWarm(ctx context.Context) (unlock func(), err error) {
	parent := filepath.Join(t.Dir, warmDirName)
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return nil, fmt.Errorf("creating warm dir: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(parent, ".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening warm lock: %w", err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil // closing releases the lock
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("locking warm dir: %w", err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("waiting for another warm build: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// WarmSandboxDir holds the state dirs of the sandboxes that warm builds
// boot (one per build in progress; a crashed builder leaves its own for the
// next builder, who holds LockWarm, to destroy).
func (t *Template) WarmSandboxDir() string { return filepath.Join(t.Dir, warmDirName, ".sandboxes") }

// NewCheckpointDir makes a private dir to build a warm checkpoint in; pass
// it to PublishCheckpoint.
func (t *Template) NewCheckpointDir() (string, error) {
	parent := filepath.Join(t.Dir, warmDirName)
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return "", fmt.Errorf("creating warm dir: %w", err)
	}
	return os.MkdirTemp(parent, warmBuildPrefix)
}

// PublishCheckpoint writes c's manifest into work (from NewCheckpointDir),
// flushes it and moves it into place as the checkpoint with c.Key; one
// published meanwhile by another builder wins. It then prunes the oldest
// checkpoints beyond the few kept.
func (t *Template) PublishCheckpoint(work string, c *Checkpoint) (*Checkpoint, error) {
	b, _ := json.MarshalIndent(c, "", "  ")
	if err := writeSynced(filepath.Join(work, warmManifestName), b); err != nil {
		return nil, fmt.Errorf("writing warm checkpoint manifest: %w", err)
	}
	final := filepath.Join(t.Dir, warmDirName, c.Key)
	if err := os.Rename(work, final); err != nil {
		if existing, err2 := t.Checkpoint(c.Key); err2 == nil {
			_ = os.RemoveAll(work)
			return existing, nil
		}
		return nil, fmt.Errorf("publishing warm checkpoint: %w", err)
	}
	t.pruneCheckpoints(c.Key)
	out := *c
	out.Dir = final
	return &out, nil
}

// AdoptCheckpoints gives t the warm checkpoints of from, a build of the
// same layers, defaults and warm step (a rebuild that changed nothing):
// each complete one is hard-linked into t's warm dir (checkpoints are only
// read: a restore copies the disk image) and published. It returns how
// many t got; one it cannot link is skipped, for t's own warm build.
func (t *Template) AdoptCheckpoints(from *Template) int {
	ents, err := os.ReadDir(filepath.Join(from.Dir, warmDirName))
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range ents {
		c, err := from.Checkpoint(e.Name())
		if err != nil || !e.IsDir() {
			continue
		}
		work, err := t.NewCheckpointDir()
		if err != nil {
			return n
		}
		if err := linkTree(c.Dir, work); err != nil {
			_ = os.RemoveAll(work)
			continue
		}
		if _, err := t.PublishCheckpoint(work, c); err == nil {
			n++
		} else {
			_ = os.RemoveAll(work)
		}
	}
	return n
}

// linkTree hard-links the files of src into dst (an existing dir),
// making its directories; the manifest is left for PublishCheckpoint.
func linkTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil || rel == "." || rel == warmManifestName {
			return err
		}
		if d.IsDir() {
			return os.Mkdir(filepath.Join(dst, rel), 0o700)
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s: not a regular file", p)
		}
		return os.Link(p, filepath.Join(dst, rel))
	})
}

// pruneCheckpoints removes all but the newest checkpoints (keeping keep),
// and builds a crash left behind.
func (t *Template) pruneCheckpoints(keep string) {
	parent := filepath.Join(t.Dir, warmDirName)
	ents, err := os.ReadDir(parent)
	if err != nil {
		return
	}
	type ck struct {
		name string
		at   time.Time
	}
	var cks []ck
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil {
			continue
		}
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") { // the lock, builds, build sandboxes
			if strings.HasPrefix(e.Name(), warmBuildPrefix) && time.Since(fi.ModTime()) > time.Hour {
				_ = os.RemoveAll(filepath.Join(parent, e.Name()))
			}
			continue
		}
		if e.Name() != keep {
			cks = append(cks, ck{e.Name(), fi.ModTime()})
		}
	}
	slices.SortFunc(cks, func(a, b ck) int { return b.at.Compare(a.at) })
	for i, c := range cks {
		if i >= keepCheckpoints-1 {
			_ = os.RemoveAll(filepath.Join(parent, c.name))
		}
	}
}

// updateWarm records a changed warm step in a cached build's manifest
// (the root filesystem stays as it is).
func updateWarm(t *Template, w *Warm) error {
	if warmEqual(t.Warm, w) {
		return nil
	}
	t.Warm = w
	b, _ := json.MarshalIndent(t, "", "  ")
	if err := writeSynced(filepath.Join(t.Dir, manifestName), b); err != nil {
		return fmt.Errorf("updating template manifest: %w", err)
	}
	return nil
}

func warmEqual(a, b *Warm) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// writeSynced replaces path atomically with b, flushed to disk.
func writeSynced(path string, b []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return nil
}
