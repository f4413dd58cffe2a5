package console

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// vendored reads web/vendor.txt: node_modules path -> name in assets/vendor.
func vendored(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile("web/vendor.txt")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		src, name, ok := strings.Cut(line, " ")
		if !ok {
			t.Fatalf("vendor.txt: bad line %q", line)
		}
		out[src] = name
	}
	return out
}

// TestVendorChecksums: the committed vendor files are exactly those
// vendor.txt names, with the checksums SHA256SUMS records (make
// console-vendor writes both), and nothing else is in assets/vendor.
func TestVendorChecksums(t *testing.T) {
	want := map[string]bool{"SHA256SUMS": true}
	for _, name := range vendored(t) {
		want[name] = true
	}
	sums, err := fs.ReadFile(files, "vendor/SHA256SUMS")
	if err != nil {
		t.Fatal(err)
	}
	summed := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(sums)), "\n") {
		sum, name, ok := strings.Cut(line, "  ")
		if !ok {
			t.Fatalf("SHA256SUMS: bad line %q", line)
		}
		b, err := fs.ReadFile(files, "vendor/"+name)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if h := sha256.Sum256(b); hex.EncodeToString(h[:]) != sum {
			t.Errorf("vendor/%s does not match its checksum in SHA256SUMS: run make console-vendor", name)
		}
		summed[name] = true
	}
	entries, err := fs.ReadDir(files, "vendor")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !want[e.Name()] {
			t.Errorf("vendor/%s is not in web/vendor.txt", e.Name())
		}
		delete(want, e.Name())
	}
	for name := range want {
		if name != "SHA256SUMS" && !summed[name] {
			t.Errorf("vendor/%s: listed in vendor.txt but missing or not in SHA256SUMS", name)
		}
	}
}

// TestVendorMatchesLock: when node_modules is installed (make
// console-vendor, or npm ci in web/), every installed package is the
// version package-lock.json locks and every vendor file is byte for byte
// the package's file. Without node_modules there is nothing to compare
// (TestVendorChecksums still pins the files).
func TestVendorMatchesLock(t *testing.T) {
	if _, err := os.Stat("web/node_modules"); err != nil {
		t.Skip("web/node_modules not installed (make console-vendor installs it)")
	}
	var lock struct {
		Packages map[string]struct {
			Version string `json:"version"`
		} `json:"packages"`
	}
	b, err := os.ReadFile("web/package-lock.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &lock); err != nil {
		t.Fatal(err)
	}
	for src, name := range vendored(t) {
		pkg := strings.SplitN(src, "/", 3)
		dir := pkg[0]
		if strings.HasPrefix(dir, "@") {
			dir += "/" + pkg[1]
		}
		var installed struct {
			Version string `json:"version"`
		}
		pj, err := os.ReadFile(filepath.Join("web/node_modules", dir, "package.json"))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(pj, &installed); err != nil {
			t.Fatal(err)
		}
		if locked := lock.Packages["node_modules/"+dir].Version; locked == "" || installed.Version != locked {
			t.Errorf("%s: installed %s, locked %q: run make console-vendor", dir, installed.Version, locked)
			continue
		}
		orig, err := os.ReadFile(filepath.Join("web/node_modules", src))
		if err != nil {
			t.Fatal(err)
		}
		copied, err := fs.ReadFile(files, "vendor/"+name)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(orig, copied) {
			t.Errorf("vendor/%s differs from node_modules/%s: run make console-vendor", name, src)
		}
	}
}
