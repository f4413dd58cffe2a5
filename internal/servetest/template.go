package servetest

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/template"
)

// Builtin builds the built-in template name (and its warm snapshot for
// this kiln build) into KILN_DATA_DIR where they are missing, as a user
// would: kiln template build NAME. make test builds the on-demand
// built-ins (desktop) before the tests, so this finds every step cached;
// run alone, the first build downloads Debian packages (about a minute).
// Test packages run in parallel and a local build has no lock of its
// own, so builds of one data dir take turns on a file lock.
func Builtin(t testing.TB, kiln, name string) {
	t.Helper()
	dir := template.Dir(config.FromEnv().DataDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".test-build.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatalf("locking the template builds: %v", err)
	}
	t0 := time.Now()
	out, err := exec.Command(kiln, "template", "build", "--progress=plain", name).CombinedOutput()
	if err != nil {
		t.Fatalf("kiln template build %s: %v\n%s", name, err, out)
	}
	t.Logf("kiln template build %s: %s", name, time.Since(t0).Round(time.Millisecond))
}
