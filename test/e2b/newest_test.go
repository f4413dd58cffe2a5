package e2b_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// newestPackages are the SDK packages tried at their newest published
// versions besides the pinned ones.
var newestPackages = []string{"e2b", "@e2b/code-interpreter"}

// npmTimeout bounds each npm call of installNewest.
const npmTimeout = 3 * time.Minute

// installNewest installs the newest published e2b and
// @e2b/code-interpreter into a fresh npm project named "newest" and
// returns its directory. It skips the test, saying why, when the
// registry cannot be asked or installed from (no network is not the
// server's fault), or when the newest versions are latest/'s pinned
// ones, which the sdk/latest test runs already.
func installNewest(t *testing.T) string {
	t.Helper()
	pinned := readDeps(t, filepath.Join("latest", "package.json"))
	want := map[string]string{}
	same := true
	for _, p := range newestPackages {
		out, err := npm(t, "", "view", p, "version")
		if err != nil {
			t.Skipf("npm registry unreachable, the newest %s not tried: %v: %s", p, err, out)
		}
		want[p] = strings.TrimSpace(out)
		same = same && want[p] == pinned[p]
	}
	if same {
		t.Skipf("the newest published SDKs (%v) are latest/'s pinned ones, tested above", want)
	}
	t.Logf("trying the newest published SDKs %v (latest/ pins %v)", want, pinned)
	dir := filepath.Join(t.TempDir(), "newest")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(map[string]any{"name": "kiln-e2b-sdk-newest", "private": true,
		"dependencies": want, "overrides": map[string]string{"e2b": "$e2b"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "package.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := npm(t, dir, "install", "--no-audit", "--no-fund", "--loglevel=error"); err != nil {
		t.Skipf("npm install of the newest SDKs %v failed, not tried: %v: %s", want, err, out)
	}
	return dir
}

// npm runs npm args in dir ("" for here) and returns its standard
// output, or its error output with the error.
func npm(t *testing.T, dir string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), npmTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "npm", args...)
	cmd.Dir = dir
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return stderr.String(), err
	}
	return string(out), nil
}

// readDeps returns the dependencies of the npm project file pkg.
func readDeps(t *testing.T, pkg string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(pkg)
	if err != nil {
		t.Fatal(err)
	}
	var p struct {
		Dependencies map[string]string `json:"dependencies"`
	}
	if err := json.Unmarshal(b, &p); err != nil {
		t.Fatalf("%s: %v", pkg, err)
	}
	return p.Dependencies
}
