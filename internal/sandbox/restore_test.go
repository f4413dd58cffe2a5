package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/oci"
	"github.com/kiln-sh/kiln/internal/oci/ocitest"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/sandbox/sandboxtest"
)

// holderScript keeps argv[1] MiB of random bytes in memory, writes their
// SHA-256 to /tmp/hash0, then serves requests dropped into /tmp/cmd:
// "sum" hashes the memory (touching every page), "mark V" first writes V
// into one byte of every page (dirtying all of them). The answer, "<sha256>
// <first byte>", goes to /tmp/reply.
const holderScript = `import hashlib, os, sys, time
n = int(sys.argv[1]) << 20
d = bytearray(os.urandom(n))
def put(name, s):
    with open("/tmp/" + name + ".tmp", "w") as f:
        f.write(s)
    os.rename("/tmp/" + name + ".tmp", "/tmp/" + name)
put("hash0", hashlib.sha256(d).hexdigest())
while True:
    try:
        with open("/tmp/cmd") as f:
            cmd = f.read().split()
        os.remove("/tmp/cmd")
    except FileNotFoundError:
        time.sleep(0.02)
        continue
    if cmd[0] == "mark":
        d[0:n:4096] = bytes([int(cmd[1])]) * len(range(0, n, 4096))
    put("reply", "%s %d" % (hashlib.sha256(d).hexdigest(), d[0]))
`

// startHolder starts holderScript over mib MiB in e and returns the hash
// of its memory.
func startHolder(t *testing.T, e *env, mib int) string {
	t.Helper()
	e.Sh("cat > /tmp/holder.py <<'EOF'\n" + holderScript + "EOF")
	e.Sh(fmt.Sprintf("nohup python3 /tmp/holder.py %d >/tmp/holder.log 2>&1 &", mib))
	r := e.Sh("for i in $(seq 1200); do [ -f /tmp/hash0 ] && break; sleep 0.05; done; cat /tmp/hash0")
	if len(r.Stdout) != 64 {
		t.Fatalf("holder did not start: %q %q", r.Stdout, e.Sh("cat /tmp/holder.log").Stdout)
	}
	return r.Stdout
}

// askHolder sends cmd to the holder in e and returns its answer.
func askHolder(t *testing.T, e *env, cmd string) (sum string, first int) {
	t.Helper()
	r := e.Sh("rm -f /tmp/reply; echo " + cmd + " > /tmp/cmd.new && mv /tmp/cmd.new /tmp/cmd; " +
		"for i in $(seq 1200); do [ -f /tmp/reply ] && break; sleep 0.05; done; cat /tmp/reply")
	if _, err := fmt.Sscan(r.Stdout, &sum, &first); err != nil || len(sum) != 64 {
		t.Fatalf("holder answered %q to %q (%v)", r.Stdout, cmd, err)
	}
	return sum, first
}

// holderSource makes a Manager and a runsc sandbox in it that holds mib
// MiB in memory (holderScript), and returns them and the memory's hash.
func holderSource(t *testing.T, mib int) (sandbox.Config, *sandbox.Manager, *sandbox.Images, *env, string) {
	t.Helper()
	requireRunsc(t)
	cfg := testConfig(t)
	m, im := newImages(t, cfg)
	killAllOnCleanup(t, m)
	src := create(t, m, sandbox.CreateOptions{Runtime: "runsc"})
	return cfg, m, im, src, startHolder(t, src, mib)
}

// boxOf is the test Box of running sandbox sb.
func boxOf(t *testing.T, m *sandbox.Manager, sb sandbox.Sandbox) *env {
	t.Helper()
	a, err := m.Agent(sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	return sandboxtest.Wrap(t, m, sb, a)
}

// A resumed sandbox's memory is what it was before the pause, page for
// page, whether its image was still in the host's page cache (read
// through it) or not (read with O_DIRECT), and a sandbox made from a
// snapshot whose image is cold has the snapshot's memory too.
func TestRestoreMemoryIntact(t *testing.T) {
	requireRunsc(t)
	cfg := testConfig(t)
	m, im := newImages(t, cfg)
	ctx := context.Background()
	for _, tt := range []struct {
		name   string
		cold   bool
		direct bool
	}{
		{"hot image", false, false},
		{"cold image", true, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := create(t, m, sandbox.CreateOptions{Runtime: "runsc"})
			want := startHolder(t, e, 64)
			if _, err := m.Pause(ctx, e.SB.ID); err != nil {
				t.Fatalf("pause: %v", err)
			}
			img := filepath.Join(cfg.StateDir, e.SB.ID.String(), "checkpoint")
			if tt.cold {
				ocitest.DropFromPageCache(t, filepath.Join(img, "pages.img"))
			}
			// The restore takes the path the test is about.
			if got := oci.RestoreDirect(img); got != tt.direct {
				t.Fatalf("oci.RestoreDirect = %v, want %v", got, tt.direct)
			}
			sb, err := m.Resume(ctx, e.SB.ID)
			if err != nil {
				t.Fatalf("resume: %v", err)
			}
			e = boxOf(t, m, sb)
			if got, _ := askHolder(t, e, "sum"); got != want {
				t.Errorf("memory after resume hashes to %s, before the pause %s", got, want)
			}
		})
	}

	t.Run("snapshot with a cold image", func(t *testing.T) {
		killAllOnCleanup(t, m)
		src := create(t, m, sandbox.CreateOptions{Runtime: "runsc"})
		want := startHolder(t, src, 64)
		snap, err := im.Snapshot(ctx, src.SB.ID, "cold")
		if err != nil {
			t.Fatal(err)
		}
		img := filepath.Join(snapshotDir(cfg), snap.ID, "checkpoint")
		ocitest.DropFromPageCache(t, filepath.Join(img, "pages.img"))
		if !oci.RestoreDirect(img) {
			t.Fatal("the dropped snapshot image is not seen as cold")
		}
		sb, err := m.Create(ctx, sandbox.CreateOptions{Snapshot: "cold"})
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := askHolder(t, boxOf(t, m, sb), "sum"); got != want {
			t.Errorf("memory of a sandbox from the snapshot hashes to %s, the source's %s", got, want)
		}
	})
}

// Eight forks of one sandbox each dirty every page of the memory they
// inherited, each with its own value: every fork sees its own writes only,
// and the source sees none of them.
func TestForkEightDiverge(t *testing.T) {
	_, m, im, src, want := holderSource(t, 16)
	ctx := context.Background()
	sbs, err := im.Fork(ctx, src.SB.ID, 8, sandbox.Quota{})
	if err != nil {
		t.Fatalf("fork into 8: %v", err)
	}
	forks := make([]*env, len(sbs))
	for i, sb := range sbs {
		forks[i] = boxOf(t, m, sb)
	}
	sums := make([]string, len(forks))
	var wg sync.WaitGroup
	for i, f := range forks {
		wg.Go(func() {
			if got, _ := askHolder(t, f, "sum"); got != want {
				t.Errorf("fork %d starts with memory %s, the source had %s", i, got, want)
			}
			sum, first := askHolder(t, f, fmt.Sprintf("mark %d", 10+i))
			if first != 10+i {
				t.Errorf("fork %d reads back %d", i, first)
			}
			sums[i] = sum
		})
	}
	wg.Wait()
	seen := map[string]int{want: -1}
	for i, f := range forks {
		if j, dup := seen[sums[i]]; dup {
			t.Errorf("forks %d and %d have the same memory %s", i, j, sums[i])
		}
		seen[sums[i]] = i
		// Asked again after all have written: still its own.
		if sum, first := askHolder(t, f, "sum"); sum != sums[i] || first != 10+i {
			t.Errorf("fork %d changed after the others wrote: %s %d, was %s %d", i, sum, first, sums[i], 10+i)
		}
	}
	if got, _ := askHolder(t, src, "sum"); got != want {
		t.Errorf("source memory changed by its forks: %s, was %s", got, want)
	}
}

// A snapshot's image removed while sandboxes made from it run does not
// touch them (their memory was read in before they ran); an image whose
// pages file was cut short fails the create with a reason and leaves
// nothing behind.
func TestRestoreImageRemovedOrCut(t *testing.T) {
	cfg, m, im, src, want := holderSource(t, 32)
	ctx := context.Background()
	for _, name := range []string{"removed", "cut"} {
		if _, err := im.Snapshot(ctx, src.SB.ID, name); err != nil {
			t.Fatal(err)
		}
	}

	sb, err := m.Create(ctx, sandbox.CreateOptions{Snapshot: "removed"})
	if err != nil {
		t.Fatal(err)
	}
	if err := im.DeleteSnapshot(ctx, "", "removed"); err != nil {
		t.Fatalf("deleting the snapshot: %v", err)
	}
	if got, _ := askHolder(t, boxOf(t, m, sb), "sum"); got != want {
		t.Errorf("memory after its snapshot was deleted: %s, want %s", got, want)
	}

	snaps, err := im.Snapshots(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	var cut string
	for _, s := range snaps {
		if s.Name == "cut" {
			cut = filepath.Join(snapshotDir(cfg), s.ID, "checkpoint", "pages.img")
		}
	}
	fi, err := os.Stat(cut)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(cut, fi.Size()/2); err != nil {
		t.Fatal(err)
	}
	before := countState(t, m, cfg)
	_, err = m.Create(ctx, sandbox.CreateOptions{Snapshot: "cut"})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "damaged") {
		t.Errorf("create from a snapshot with a cut pages file: %v", err)
	} else {
		t.Logf("create from a cut image: %v", err)
	}
	if got := settledState(t, m, cfg, before); got != before {
		t.Errorf("failed create left state: %s, was %s", got, before)
	}
}

// A fork's files are the source's as of the checkpoint, also data the
// source wrote through a shared memory mapping and never flushed: runsc
// flushes it to the layer with the checkpoint, after Fork copied the
// layer for the forks it prepares meanwhile, and Fork must notice.
func TestForkKeepsMappedWrites(t *testing.T) {
	_, m, im, src, _ := holderSource(t, 1)
	ctx := context.Background()
	src.Sh(`nohup python3 -c '
import mmap, os, time
fd = os.open("/home/user/mapped.bin", os.O_RDWR | os.O_CREAT, 0o644)
os.ftruncate(fd, 1 << 20)
m = mmap.mmap(fd, 1 << 20)
for off in range(0, 1 << 20, 4096):
    m[off:off + 9] = b"fork-data"
open("/tmp/mapped", "w").close()
time.sleep(3600)
' >/tmp/mapped.log 2>&1 &`)
	if r := src.Sh("for i in $(seq 600); do [ -f /tmp/mapped ] && break; sleep 0.05; done; ls /tmp/mapped"); r.Stdout != "/tmp/mapped\n" {
		t.Fatalf("mapper did not start: %q", src.Sh("cat /tmp/mapped.log").Stdout)
	}
	sbs, err := im.Fork(ctx, src.SB.ID, 2, sandbox.Quota{})
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	const check = `python3 -c '
d = open("/home/user/mapped.bin", "rb").read()
print(sum(d[off:off + 9] == b"fork-data" for off in range(0, len(d), 4096)))'`
	for i, sb := range sbs {
		if r := boxOf(t, m, sb).Sh(check); r.Stdout != "256\n" {
			t.Errorf("fork %d reads %q pages of the mapped file as written (want 256): %s", i, r.Stdout, r.Stderr)
		}
	}
}

// With Config.ResumeReady a paused runsc sandbox gets a created (not
// started) container after its pause, and its resume restores into it:
// the memory is what it was before the pause, page for page. A paused
// sandbox killed while ready leaves nothing behind. The processes the
// ready container holds are logged (its cost per paused sandbox).
func TestResumeReady(t *testing.T) {
	requireRunsc(t)
	cfg := testConfig(t)
	cfg.ResumeReady = true
	m, _ := newImages(t, cfg)
	killAllOnCleanup(t, m)
	ctx := context.Background()
	rt := runtimes(cfg.Config)["runsc"]
	ready := func(id sandbox.ID) oci.State {
		t.Helper()
		for range 600 {
			if st, err := rt.State(ctx, id.String()); err == nil && st.Status == oci.StatusCreated {
				return st
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatalf("no created container for paused sandbox %s", id)
		return oci.State{}
	}

	e := create(t, m, sandbox.CreateOptions{Runtime: "runsc"})
	want := startHolder(t, e, 64)
	if _, err := m.Pause(ctx, e.SB.ID); err != nil {
		t.Fatalf("pause: %v", err)
	}
	st := ready(e.SB.ID)
	var pss []string
	for _, pid := range append([]int{st.Pid}, st.HelperPids...) {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
		for line := range strings.SplitSeq(string(b), "\n") {
			if strings.HasPrefix(line, "Pss:") {
				pss = append(pss, fmt.Sprintf("pid %d %s", pid, strings.Join(strings.Fields(line)[1:], " ")))
			}
		}
	}
	t.Logf("a ready paused sandbox holds: %s", strings.Join(pss, ", "))
	t0 := time.Now()
	sb, err := m.Resume(ctx, e.SB.ID)
	if err != nil {
		t.Fatalf("resume: %v", err)
	}
	t.Logf("resume into the created container: %v", time.Since(t0))
	e = boxOf(t, m, sb)
	if got, _ := askHolder(t, e, "sum"); got != want {
		t.Errorf("memory after resume hashes to %s, before the pause %s", got, want)
	}
	if sum, first := askHolder(t, e, "mark 7"); first != 7 || sum == want {
		t.Errorf("the resumed holder cannot write its memory: %s %d", sum, first)
	}

	// Paused again (ready again), then killed.
	if _, err := m.Pause(ctx, e.SB.ID); err != nil {
		t.Fatalf("second pause: %v", err)
	}
	st = ready(e.SB.ID)
	if err := m.Kill(ctx, e.SB.ID); err != nil {
		t.Fatalf("kill: %v", err)
	}
	assertNothingLeft(t, cfg, e.SB.ID, st.Pid)
}
