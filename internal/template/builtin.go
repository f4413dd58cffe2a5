package template

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
)

var hashRE = regexp.MustCompile(`^[0-9a-f]{16}$`)

// A built-in template's builds live in Dir(dataDir)/<name>/<hash>, each a
// manifest (template.json) naming its layers, which live in BuiltinLayers,
// plus its warm checkpoints (warm/); <name>/current points at the one in
// use. Builds a rebuild replaced stay, so that sandboxes made from them
// keep working.

// BuiltinLayers is the layer store of the built-in templates' layers, apart
// from a server's (DataDir/layers), whose collections never see it.
func BuiltinLayers(dataDir string) string { return filepath.Join(Dir(dataDir), ".layers") }

// BuiltinHash identifies a built-in's build by what its sandboxes get:
// the layers (their keys, bottom first) and the defaults.
func BuiltinHash(layerKeys []string, d Defaults) string {
	b, _ := json.Marshal(struct {
		L []string
		D Defaults
	}{layerKeys, d})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// PublishBuiltin makes t (Name, Hash, Layers, Defaults, Warm) the current
// build of the built-in t.Name, writing its manifest unless the same build
// is there (then only a changed warm step is recorded). It reports whether
// the build was there already.
func PublishBuiltin(dataDir string, t *Template) (existed bool, err error) {
	if !ValidName(t.Name) || !hashRE.MatchString(t.Hash) {
		return false, fmt.Errorf("built-in template %q build %q: malformed", t.Name, t.Hash)
	}
	tdir := filepath.Join(Dir(dataDir), t.Name)
	dir := filepath.Join(tdir, t.Hash)
	if old, err := ReadBuild(dir); err == nil {
		if err := updateWarm(old, t.Warm); err != nil {
			return false, err
		}
		return true, setCurrent(tdir, t.Hash)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, fmt.Errorf("creating template dir: %w", err)
	}
	if err := WriteManifest(dir, t); err != nil {
		return false, err
	}
	return false, setCurrent(tdir, t.Hash)
}

// setCurrent atomically points tdir/current at the build hash.
func setCurrent(tdir, hash string) error {
	link := filepath.Join(tdir, "current")
	if cur, err := os.Readlink(link); err == nil && cur == hash {
		return nil
	}
	tmp := link + ".new"
	_ = os.Remove(tmp)
	if err := os.Symlink(hash, tmp); err != nil {
		return fmt.Errorf("linking current build: %w", err)
	}
	if err := os.Rename(tmp, link); err != nil {
		return fmt.Errorf("switching current build: %w", err)
	}
	return nil
}
