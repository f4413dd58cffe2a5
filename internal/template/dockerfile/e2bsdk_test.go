package dockerfile

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// e2bSDK is the stock E2B JS SDK the test/e2b suite installs (npm ci in
// test/e2b/latest).
const e2bSDK = "../../../test/e2b/latest/node_modules/e2b"

// filesHashJS prints, for each source of argv (after the SDK's path and
// the context), the filesHash E2B's SDK computes for copying it to /dst/.
const filesHashJS = `
const { Template } = require(process.argv[2]);
(async () => {
  const [ctx, ...srcs] = process.argv.slice(3);
  let t = Template({ fileContextPath: ctx }).fromImage('debian');
  for (const s of srcs) t = t.copy(s, '/dst/');
  const spec = JSON.parse(await Template.toJSON(t));
  for (const s of spec.steps) if (s.type === 'COPY') console.log(s.args[0] + '\t' + s.filesHash);
})().catch((e) => { console.error(e.message); process.exit(1); });
`

// TestFilesHashMatchesE2BSDK computes FilesHash for a sample context with
// E2B's own SDK (calculateFilesHash, through Template.toJSON) and with
// Context, directories and links included. The .dockerignore holds only
// patterns on which Docker's rules and the SDK's glob ignores agree.
func TestFilesHashMatchesE2BSDK(t *testing.T) {
	sdk, err := filepath.Abs(e2bSDK)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(sdk, "package.json")); err != nil {
		t.Skip("the E2B SDK is not installed (npm ci in test/e2b/latest): ", err)
	}
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("node is not installed")
	}
	var files []file
	for _, f := range sample {
		switch {
		case f.path == ".dockerignore":
			f.data = "*.log\nsecret.txt\n"
		case strings.HasPrefix(f.path, "build/"), strings.HasPrefix(f.path, "node_modules/"), strings.HasSuffix(f.path, ".tmp"):
			continue
		}
		files = append(files, f)
	}
	dir := writeContext(t, append(files, pick(golden, "\uff5e.txt", "\U0001F600.txt")...))
	// Not "*/*.py": the SDK's glob goes through the link dirlink there
	// (dirlink/b.py), where Docker, and Context, do not follow links.
	srcs := []string{".", "sub", "sub/deep", "*.txt", "sub/*.py", "s*/*.py", "s?b", "a.txt", "run.sh", "link", "dirlink", "outside", "sub/empty", ".hidden"}

	script := filepath.Join(t.TempDir(), "hash.js")
	if err := os.WriteFile(script, []byte(filesHashJS), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("node", append([]string{script, sdk, dir}, srcs...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, stderr.Bytes())
	}
	want := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		src, hash, _ := strings.Cut(sc.Text(), "\t")
		want[src] = hash
	}
	c := openContext(t, dir)
	for _, src := range srcs {
		got, err := c.FilesHash(src, "/dst/")
		if err != nil {
			t.Errorf("FilesHash(%q): %v", src, err)
			continue
		}
		if want[src] == "" || got != want[src] {
			t.Errorf("FilesHash(%q) = %s, E2B's SDK says %q", src, got, want[src])
		}
	}
}
