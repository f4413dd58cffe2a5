// Package e2b_test drives a real kiln serve with the stock E2B JavaScript
// SDKs (npm e2b and @e2b/code-interpreter, unchanged, configured only by
// E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY): the newest release and an
// older 2.x pair that still uses the v1 control-plane paths. The tests
// themselves are JavaScript (tests/*.test.mjs, node's test runner); see
// README.md.
package e2b_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/network/nettest"
	"github.com/kiln-sh/kiln/internal/oci/ocitest"
	"github.com/kiln-sh/kiln/internal/servetest"
	"github.com/kiln-sh/kiln/internal/template"
)

// sdks are the npm projects under this directory, one per SDK version.
var sdks = []string{"latest", "v1"}

// TestStockSDKs runs every JS test file against kiln serve once per SDK
// version, both versions at once.
func TestStockSDKs(t *testing.T) {
	requireSuite(t)
	srv := servetest.Start(t, servetest.Build(t))
	t.Run("sdk", func(t *testing.T) { runPinned(t, srv, nil) })
	// After the pinned pair, not beside it: the machine may be small.
	t.Run("sdk/newest", func(t *testing.T) {
		dir := installNewest(t)
		runNode(t, dir, srv, nil)
	})
	// Each test file kills its sandboxes, and the quick-start programs theirs.
	if ids := srv.Alive(t); len(ids) > 0 {
		t.Errorf("sandboxes left after the JS tests: %v", ids)
	}
}

// runPinned runs the JS test files (all, or files) once per pinned SDK
// version, both versions at once, with env added to node's environment.
func runPinned(t *testing.T, srv *servetest.Server, env []string, files ...string) {
	for _, sdk := range sdks {
		t.Run(sdk, func(t *testing.T) {
			t.Parallel()
			runSDK(t, sdk, srv, env, files...)
		})
	}
}

// runSDK runs the JS test files (all, or files) with the pinned SDK
// version sdk (a project under this directory) against srv.
func runSDK(t *testing.T, sdk string, srv *servetest.Server, env []string, files ...string) {
	dir, err := filepath.Abs(sdk)
	if err != nil {
		t.Fatal(err)
	}
	npmCI(t, dir)
	runNode(t, dir, srv, env, files...)
}

// requireSuite fails (skips outside CI) t unless the JS suite can run:
// root, the built templates base and code-interpreter, node and npm.
func requireSuite(t *testing.T) {
	t.Helper()
	ocitest.RequireRoot(t)
	dataDir := config.FromEnv().DataDir
	for _, name := range []string{"base", "code-interpreter"} {
		_, err := template.Lookup(dataDir, name)
		ocitest.Require(t, err == nil, fmt.Sprintf("template %s not built (make setup): %v", name, err))
	}
	requireNode(t)
}

// minNode is the oldest node the pinned SDKs support (their engines field).
var minNode = [3]int{20, 18, 1}

func requireNode(t *testing.T) {
	t.Helper()
	_, npmErr := exec.LookPath("npm")
	out, err := exec.Command("node", "--version").Output()
	ocitest.Require(t, err == nil && npmErr == nil, fmt.Sprintf("node and npm are needed (scripts/setup-deps.sh installs them): %v %v", err, npmErr))
	var v [3]int
	for i, f := range strings.SplitN(strings.TrimPrefix(strings.TrimSpace(string(out)), "v"), ".", 3) {
		v[i], _ = strconv.Atoi(f)
	}
	old := v[0] < minNode[0] || v[0] == minNode[0] && (v[1] < minNode[1] || v[1] == minNode[1] && v[2] < minNode[2])
	ocitest.Require(t, !old, fmt.Sprintf("node %s is older than the SDKs' minimum %d.%d.%d (scripts/setup-deps.sh)", strings.TrimSpace(string(out)), minNode[0], minNode[1], minNode[2]))
}

// npmCI installs dir's locked packages unless node_modules already holds
// exactly them: a stamp records the hash of package.json and the lockfile.
// A file lock keeps concurrent test runs from installing at once.
func npmCI(t *testing.T, dir string) {
	t.Helper()
	h := sha256.New()
	for _, f := range []string{"package.json", "package-lock.json"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		h.Write(b)
	}
	sum := hex.EncodeToString(h.Sum(nil))
	stamp := filepath.Join(dir, "node_modules", ".kiln-npm-ci")

	lock, err := os.OpenFile(filepath.Join(dir, ".npm-ci.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(stamp); err == nil && string(b) == sum {
		return
	}
	cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund", "--loglevel=error")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm ci in %s: %v\n%s", dir, err, out)
	}
	if err := os.WriteFile(stamp, []byte(sum), 0o644); err != nil {
		t.Fatal(err)
	}
}

// nodeTimeout bounds one SDK version's whole JS run.
const nodeTimeout = 12 * time.Minute

// runNode runs run.mjs in dir against srv, with env added to the SDKs'
// (sdkEnv), for the test files whose names contain one of files (all
// without; E2B_TEST_FILES, space-separated, when nil), logging its output
// as it comes, and fails with the names of the JS tests that failed.
func runNode(t *testing.T, dir string, srv *servetest.Server, env []string, files ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), nodeTimeout)
	defer cancel()
	runMJS, err := filepath.Abs("run.mjs")
	if err != nil {
		t.Fatal(err)
	}
	if files == nil {
		files = strings.Fields(os.Getenv("E2B_TEST_FILES"))
	}
	cmd := exec.CommandContext(ctx, "node", append([]string{runMJS}, files...)...)
	cmd.Dir = dir
	cmd.Env = append(sdkEnv(dir, srv), env...)
	// On timeout, end node's test-file processes too: they are its group.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var failed []string
	summary := ""
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			line := sc.Text()
			t.Log(line)
			if f, ok := strings.CutPrefix(line, "e2e-failed: "); ok {
				failed = append(failed, f)
			}
			if summaryRE.MatchString(line) {
				summary = line
			}
		}
		io.Copy(io.Discard, pr)
	}()
	err = cmd.Wait()
	pw.Close()
	<-done
	switch {
	case ctx.Err() != nil:
		t.Errorf("%s: the JS tests did not finish in %v", filepath.Base(dir), nodeTimeout)
	case err != nil && len(failed) > 0:
		t.Errorf("%s: %d JS tests failed:\n  %s", filepath.Base(dir), len(failed), strings.Join(failed, "\n  "))
	case err != nil:
		t.Errorf("%s: node ../run.mjs: %v", filepath.Base(dir), err)
	case summary == "":
		t.Errorf("%s: node ../run.mjs printed no summary", filepath.Base(dir))
	}
}

var summaryRE = regexp.MustCompile(`^\w+: \d+ passed, \d+ failed, \d+ skipped$`)

// sdkEnv is the environment of the JS tests: this process's, without any
// E2B_* variable (E2B_DEBUG would bypass the server) but run.mjs's own
// knobs, plus the three the SDKs need to reach srv.
func sdkEnv(dir string, srv *servetest.Server) []string {
	var env []string
	for _, kv := range os.Environ() {
		knob := strings.HasPrefix(kv, "E2B_RUN_KNOWN_FAILURES=") || strings.HasPrefix(kv, "E2B_TEST_CONCURRENCY=")
		if knob || !strings.HasPrefix(kv, "E2B_") {
			env = append(env, kv)
		}
	}
	env = append(env,
		"E2B_API_URL="+srv.URL,
		"E2B_SANDBOX_URL="+srv.URL,
		"E2B_VOLUME_API_URL="+srv.URL, // the Volume class's file methods
		"E2B_API_KEY="+srv.Key,
		"E2B_SDK_DIR="+dir,
	)
	return append(env, worldEnv(srv)...)
}

// worldEnv tells the network tests (tests/network.test.mjs) where things
// are in the server's test world (nettest's standard sites): a site on
// its internet by name and address, another site, the world's host (a
// service on every one of its addresses) and the metadata service.
func worldEnv(srv *servetest.Server) []string {
	if srv.World == nil {
		return nil
	}
	_, hostPort, _ := net.SplitHostPort(nettest.HostServiceAddr)
	return []string{
		"KILN_TEST_SITE_NAME=allowed.test",
		"KILN_TEST_SITE_IP=" + nettest.AllowedSite.String(),
		"KILN_TEST_SITE_BODY=allowed",
		"KILN_TEST_OTHER_SITE_IP=" + nettest.CIDRSite.String(),
		"KILN_TEST_HOST_SERVICE=" + net.JoinHostPort(nettest.HostAddr.String(), hostPort),
		"KILN_TEST_METADATA_IP=" + nettest.MetadataAddr.String(),
	}
}
