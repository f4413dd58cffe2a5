package sandbox

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// An image in the shared snapshot dir is read by nodes that did not write
// it: openImage takes it only as its record names it (the manifest's
// digest), every file listed, regular, of its size and, checked in full,
// of its digest; anything else is failed_precondition, and nothing is
// read outside the image's dir.
func TestSharedImageIntegrity(t *testing.T) {
	// seal makes an image as a pause does: a memory image, a sparse disk
	// image of 64 MiB with a little data, caps.
	seal := func(t *testing.T) (shared, ref string) {
		t.Helper()
		shared = t.TempDir()
		tmp, err := newSharedTemp(shared, "node-a")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(tmp, imageCheckpoint), 0o700); err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(tmp, imageCheckpoint, checkpointImage), strings.Repeat("memory ", 50000))
		disk, err := os.Create(filepath.Join(tmp, imageDisk))
		if err != nil {
			t.Fatal(err)
		}
		if err := disk.Truncate(64 << 20); err != nil {
			t.Fatal(err)
		}
		if _, err := disk.WriteAt([]byte("ext4 data"), 40<<20); err != nil {
			t.Fatal(err)
		}
		disk.Close()
		write(t, filepath.Join(tmp, imageCapsFile), `["CAP_CHOWN"]`)
		ref, err = sealImage(tmp, shared, pausedImagePath("imgtest0001"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(tmp); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the temp dir is still there after sealing: %v", err)
		}
		return shared, ref
	}
	const bound = 1 << 30

	shared, ref := seal(t)
	dir, err := openImage(shared, ref, bound, true)
	if err != nil {
		t.Fatalf("openImage of an intact image: %v", err)
	}
	if want := imageDir(shared, ref); dir != want {
		t.Errorf("openImage = %s, want %s", dir, want)
	}
	if ents, _ := os.ReadDir(filepath.Join(shared, sharedTmp)); len(ents) != 0 {
		t.Errorf("temp dirs left: %v", ents)
	}

	tests := []struct {
		name string
		// tamper changes the image in dir; it returns the ref to open
		// (ref unless it says otherwise).
		tamper func(t *testing.T, dir, ref string) string
		full   bool // fails only when checked in full
	}{
		{"malformed reference", func(t *testing.T, dir, ref string) string { return "../" + ref }, false},
		{"another image's digest", func(t *testing.T, dir, ref string) string {
			return ref[:len(ref)-64] + strings.Repeat("0", 64)
		}, false},
		{"a byte of the disk image changed", func(t *testing.T, dir, ref string) string {
			f, err := os.OpenFile(filepath.Join(dir, imageDisk), os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.WriteAt([]byte("E"), 40<<20); err != nil {
				t.Fatal(err)
			}
			return ref
		}, true},
		{"the memory image truncated", func(t *testing.T, dir, ref string) string {
			if err := os.Truncate(filepath.Join(dir, imageCheckpoint, checkpointImage), 100); err != nil {
				t.Fatal(err)
			}
			return ref
		}, false},
		{"an extra file", func(t *testing.T, dir, ref string) string {
			write(t, filepath.Join(dir, imageCheckpoint, "pages.img"), "injected")
			return ref
		}, false},
		{"a file replaced by a symlink", func(t *testing.T, dir, ref string) string {
			p := filepath.Join(dir, imageCapsFile)
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("/etc/hostname", p); err != nil {
				t.Fatal(err)
			}
			return ref
		}, false},
		{"a file missing", func(t *testing.T, dir, ref string) string {
			if err := os.Remove(filepath.Join(dir, imageCapsFile)); err != nil {
				t.Fatal(err)
			}
			return ref
		}, false},
		{"a manifest naming a path outside, with its own digest", func(t *testing.T, dir, ref string) string {
			data, _ := json.Marshal(manifest{Files: []manifestFile{{Path: "../../etc/passwd", Size: 1}}})
			return rewriteManifest(t, dir, ref, data)
		}, false},
		{"a manifest with unknown fields", func(t *testing.T, dir, ref string) string {
			return rewriteManifest(t, dir, ref, []byte(`{"files":[],"exec":"x"}`))
		}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			shared, ref := seal(t)
			ref = tc.tamper(t, imageDir(shared, ref), ref)
			_, err := openImage(shared, ref, bound, true)
			if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "damaged") {
				t.Errorf("openImage (full) = %v, want failed_precondition: damaged", err)
			}
			_, err = openImage(shared, ref, bound, false)
			if tc.full && err != nil {
				t.Errorf("openImage (sizes only) = %v, want it to pass: only a full check reads the bytes", err)
			} else if !tc.full && !errors.Is(err, errdefs.ErrFailedPrecondition) {
				t.Errorf("openImage (sizes only) = %v, want failed_precondition", err)
			}
		})
	}
	t.Run("larger than the limits allow", func(t *testing.T) {
		shared, ref := seal(t)
		if _, err := openImage(shared, ref, 32<<20, false); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("openImage within 32 MiB of a 64 MiB image = %v, want failed_precondition", err)
		}
	})
	t.Run("a node without the shared dir", func(t *testing.T) {
		_, ref := seal(t)
		if _, err := openImage("", ref, bound, true); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "KILN_SNAPSHOT_DIR") {
			t.Errorf("openImage with no shared dir = %v, want failed_precondition naming KILN_SNAPSHOT_DIR", err)
		}
	})
}

// A node's start removes its own unfinished images in the shared dir,
// not those of a node whose name extends its own.
func TestGCSharedTemp(t *testing.T) {
	shared := t.TempDir()
	mine, err := newSharedTemp(shared, "a")
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := newSharedTemp(shared, "a-b")
	if err != nil {
		t.Fatal(err)
	}
	if err := gcSharedTemp(shared, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(mine); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("node a's temp dir survived its clean-up: %v", err)
	}
	if _, err := os.Stat(theirs); err != nil {
		t.Errorf("node a-b's temp dir went with node a's clean-up: %v", err)
	}
}

// fileDigest is the same for a sparse file and a copy of it with its
// zeros written out, and differs when a byte does.
func TestFileDigestSparse(t *testing.T) {
	dir := t.TempDir()
	sparse, dense := filepath.Join(dir, "sparse"), filepath.Join(dir, "dense")
	f, err := os.Create(sparse)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(8 << 20); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("data"), 3<<20+5); err != nil {
		t.Fatal(err)
	}
	f.Close()
	b, err := os.ReadFile(sparse)
	if err != nil {
		t.Fatal(err)
	}
	write(t, dense, string(b))
	digest := func(p string) string {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		_, sum, err := fileDigest(f)
		if err != nil {
			t.Fatal(err)
		}
		return sum
	}
	if a, b := digest(sparse), digest(dense); a != b {
		t.Errorf("sparse %s, dense %s: want one digest", a, b)
	}
	b[3<<20+5] = 'D'
	write(t, dense, string(b))
	if digest(sparse) == digest(dense) {
		t.Error("a changed byte kept the digest")
	}
}

// rewriteManifest replaces the manifest of the image in dir and returns
// the reference with its digest (a manifest that matches its record, but
// is hostile).
func rewriteManifest(t *testing.T, dir, ref string, data []byte) string {
	t.Helper()
	write(t, filepath.Join(dir, manifestName), string(data))
	sum := sha256.Sum256(data)
	return ref[:len(ref)-64] + hex.EncodeToString(sum[:])
}

// BenchmarkFileDigest measures what checking a memory image in full costs
// per byte (b.SetBytes): a 64 MiB file of data, read from the page cache.
func BenchmarkFileDigest(b *testing.B) {
	p := filepath.Join(b.TempDir(), "image")
	data := make([]byte, 64<<20)
	for i := range data {
		data[i] = byte(i*7 + i>>9)
	}
	if err := os.WriteFile(p, data, 0o600); err != nil {
		b.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, _, err := fileDigest(f); err != nil {
			b.Fatal(err)
		}
	}
}
