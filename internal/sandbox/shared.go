package sandbox

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// Images in the shared snapshot dir (config.Cluster.SnapshotDir,
// KILN_SNAPSHOT_DIR): a directory every node of a cluster mounts at the
// same path, where a node keeps the images of its paused sandboxes and
// named snapshots so that any node can restore them. Layout:
//
//	paused/<sandbox id>.<nonce>/   a paused sandbox's image
//	snapshots/<snapshot id>/       a named snapshot's image
//	.tmp/<node>~<random>/          an image being written by <node>
//
// An image holds what capture makes (checkpoint/, disk.img, caps.json,
// network.json) and manifest.json: every file's path, size and digest.
// A node writes an image in a temp dir of its own and renames it into
// place once complete (sealImage), so no reader ever sees half an image
// and no two nodes write one path; a paused sandbox's image gets a fresh
// nonce each pause. The record (sandbox or snapshot) names the image
// with the digest of its manifest ("<path>@sha256:<hex>"): the catalog
// is what a restoring node trusts, and the shared dir's bytes must match
// it. openImage checks that before anything reads the image: the
// manifest's digest, every file regular and listed (no symlinks, no
// extra files), sizes within the record's bounds and, for a node that did
// not write it, every file's digest.
const (
	sharedPaused    = "paused"
	sharedSnapshots = "snapshots"
	sharedTmp       = ".tmp"
	manifestName    = "manifest.json"
	// tmpSep ends a node's name in its temp dirs' names: no node name
	// has one, so node "a" never takes node "a-b"'s for its own.
	tmpSep = "~"

	// maxManifestBytes and maxImageFiles bound what a manifest may list.
	maxManifestBytes = 1 << 20
	maxImageFiles    = 4096
	// digestBlock is the block of the files' digests (fileDigest).
	digestBlock = 64 << 10
)

// imageRefRE is a shared image's reference in a record.
var imageRefRE = regexp.MustCompile(`^((?:paused|snapshots)/[a-z0-9]{1,64}(?:\.[0-9a-f]{16})?)@sha256:([0-9a-f]{64})$`)

// manifest lists an image's files.
type manifest struct {
	Files []manifestFile `json:"files"`
}

type manifestFile struct {
	Path   string `json:"path"` // slash-separated, relative to the image dir
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"` // fileDigest
}

// newSharedTemp makes a temp dir for node's next image in the shared
// dir: under .tmp, named for the node, so only node ever writes it.
func newSharedTemp(shared, node string) (string, error) {
	dir := filepath.Join(shared, sharedTmp)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("creating the shared snapshot dir's temp dir: %w", err)
	}
	tmp, err := os.MkdirTemp(dir, node+tmpSep)
	if err != nil {
		return "", fmt.Errorf("creating a temp dir in the shared snapshot dir: %w", err)
	}
	return tmp, nil
}

// gcSharedTemp removes the temp dirs node left in the shared dir (a
// crash while writing an image); other nodes' are theirs.
func gcSharedTemp(shared, node string) error {
	ents, err := os.ReadDir(filepath.Join(shared, sharedTmp))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), node+tmpSep) {
			if err := os.RemoveAll(filepath.Join(shared, sharedTmp, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

// pausedImagePath is where the next image of paused sandbox id goes, a
// path never used before.
func pausedImagePath(id ID) string {
	nonce := make([]byte, 8)
	_, _ = rand.Read(nonce)
	return sharedPaused + "/" + id.String() + "." + hex.EncodeToString(nonce)
}

// sealImage writes the manifest of the image in tmp (a newSharedTemp
// dir), flushes it to disk and renames it to rel under shared, returning
// the image's reference for its record.
func sealImage(tmp, shared, rel string) (string, error) {
	var man manifest
	var dirs []string
	err := filepath.WalkDir(tmp, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, p)
			return nil
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s is not a regular file", d.Name())
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := f.Sync(); err != nil {
			return err
		}
		size, sum, err := fileDigest(f)
		if err != nil {
			return err
		}
		r, _ := filepath.Rel(tmp, p)
		man.Files = append(man.Files, manifestFile{Path: filepath.ToSlash(r), Size: size, SHA256: sum})
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("listing the image: %w", err)
	}
	data, err := json.Marshal(man)
	if err != nil {
		return "", err
	}
	if err := writeSynced(filepath.Join(tmp, manifestName), data); err != nil {
		return "", fmt.Errorf("writing the image's manifest: %w", err)
	}
	for _, d := range dirs {
		if err := syncPath(d); err != nil {
			return "", fmt.Errorf("syncing the image: %w", err)
		}
	}
	dst := filepath.Join(shared, filepath.FromSlash(rel))
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return "", fmt.Errorf("moving the image into place: %w", err)
	}
	if err := syncPath(filepath.Dir(dst)); err != nil {
		return "", fmt.Errorf("syncing the shared snapshot dir: %w", err)
	}
	sum := sha256.Sum256(data)
	return rel + "@sha256:" + hex.EncodeToString(sum[:]), nil
}

// imageDir is the dir of the image ref names under shared, unchecked
// (for removing it); "" for a malformed ref.
func imageDir(shared, ref string) string {
	m := imageRefRE.FindStringSubmatch(ref)
	if m == nil || shared == "" {
		return ""
	}
	return filepath.Join(shared, filepath.FromSlash(m[1]))
}

// imageBound is the most an image of a sandbox with limits l may hold:
// its memory image (the sandbox's memory and the sentry's state) and
// its disk image (its disk limit, sparse).
func imageBound(l Limits) int64 {
	return 2*l.MemoryBytes + l.DiskBytes + 256<<20
}

// openImage checks the image that ref (from a record) names under
// shared and returns its dir: its manifest must have ref's digest and
// list every file there is, each a regular file of the listed size,
// maxBytes in all; with full, each file's digest is checked too (a node
// restoring an image another node wrote). What fails is
// ErrFailedPrecondition: the image is damaged, or not the record's.
func openImage(shared, ref string, maxBytes int64, full bool) (string, error) {
	damaged := func(format string, args ...any) (string, error) {
		return "", fmt.Errorf("its image in the shared snapshot dir is damaged ("+format+"): %w", append(args, errdefs.ErrFailedPrecondition)...)
	}
	if shared == "" {
		return "", fmt.Errorf("its image is in the shared snapshot dir, which this node does not have (KILN_SNAPSHOT_DIR): %w", errdefs.ErrFailedPrecondition)
	}
	m := imageRefRE.FindStringSubmatch(ref)
	if m == nil {
		return damaged("malformed reference")
	}
	dir := filepath.Join(shared, filepath.FromSlash(m[1]))
	for _, d := range []string{filepath.Dir(dir), dir} {
		if fi, err := os.Lstat(d); err != nil || !fi.IsDir() {
			return damaged("%s is missing or not a directory", filepath.Base(d))
		}
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return damaged("opening it: %v", err)
	}
	defer root.Close()
	data, err := readBounded(root, manifestName, maxManifestBytes)
	if err != nil {
		return damaged("its manifest: %v", err)
	}
	if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != m[2] {
		return damaged("its manifest is not the one its record names")
	}
	var man manifest
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&man); err != nil || len(man.Files) > maxImageFiles {
		return damaged("its manifest is malformed")
	}
	listed := map[string]manifestFile{}
	for _, f := range man.Files {
		if !filepath.IsLocal(f.Path) || f.Path != filepath.ToSlash(filepath.Clean(f.Path)) || f.Path == manifestName {
			return damaged("its manifest lists %q", errdefs.ClipN(f.Path, 64))
		}
		listed[f.Path] = f
	}
	// Nothing unlisted, nothing but directories and regular files.
	var found []string
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		r, _ := filepath.Rel(dir, p)
		r = filepath.ToSlash(r)
		switch {
		case d.IsDir():
			return nil
		case !d.Type().IsRegular():
			return fmt.Errorf("%q is not a regular file", errdefs.ClipN(r, 64))
		case r == manifestName:
			return nil
		case listed[r].Path == "":
			return fmt.Errorf("%q is not in its manifest", errdefs.ClipN(r, 64))
		}
		found = append(found, r)
		return nil
	})
	if err != nil {
		return damaged("%v", err)
	}
	if len(found) != len(listed) {
		return damaged("%d of the %d files of its manifest are there", len(found), len(listed))
	}
	var total int64
	for _, p := range slices.Sorted(maps.Keys(listed)) {
		want := listed[p]
		if total += want.Size; want.Size < 0 || total > maxBytes {
			return damaged("larger than the %d MiB its sandbox's limits allow", maxBytes>>20)
		}
		if err := checkImageFile(root, want, full); err != nil {
			return damaged("%v", err)
		}
	}
	return dir, nil
}

// checkImageFile checks one listed file: its size and, with full, its
// digest.
func checkImageFile(root *os.Root, want manifestFile, full bool) error {
	f, err := root.Open(filepath.FromSlash(want.Path))
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() || fi.Size() != want.Size {
		return fmt.Errorf("%s is not the file its manifest lists", want.Path)
	}
	if !full {
		return nil
	}
	if _, sum, err := fileDigest(f); err != nil {
		return fmt.Errorf("reading %s: %w", want.Path, err)
	} else if sum != want.SHA256 {
		return fmt.Errorf("%s does not match its manifest", want.Path)
	}
	return nil
}

// readBounded reads name under root, at most limit bytes.
func readBounded(root *os.Root, name string, limit int64) ([]byte, error) {
	f, err := root.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("over %d bytes", limit)
	}
	return data, nil
}

var zeroBlock [digestBlock]byte

// fileDigest is the SHA-256 of f's size and of its blocks that are not
// all zero, each with its offset: the same for a sparse file and a copy
// of it whatever its holes (a disk image of gigabytes of which little is
// written is read only where it has data).
func fileDigest(f *os.File) (int64, string, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, "", err
	}
	size := fi.Size()
	h := sha256.New()
	var word [8]byte
	binary.LittleEndian.PutUint64(word[:], uint64(size))
	h.Write(word[:])
	buf := make([]byte, digestBlock)
	fd := int(f.Fd())
	next := int64(0) // the first block not yet read
	for off := int64(0); off < size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) { // only a hole is left
			break
		} else if errors.Is(err, unix.EINVAL) { // no SEEK_DATA here: all data
			data = off
		} else if err != nil {
			return 0, "", fmt.Errorf("seeking data: %w", err)
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			hole = size
		}
		for b := max(data/digestBlock*digestBlock, next); b < hole; b += digestBlock {
			n := min(digestBlock, size-b)
			if _, err := f.ReadAt(buf[:n], b); err != nil {
				return 0, "", err
			}
			if !bytes.Equal(buf[:n], zeroBlock[:n]) {
				binary.LittleEndian.PutUint64(word[:], uint64(b))
				h.Write(word[:])
				h.Write(buf[:n])
			}
			next = b + digestBlock
		}
		off = hole
	}
	return size, hex.EncodeToString(h.Sum(nil)), nil
}

// writeSynced writes a new file and flushes it to disk.
func writeSynced(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// syncPath flushes a file or directory to disk.
func syncPath(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
