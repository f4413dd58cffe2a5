package sandbox_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// waitPool waits until the template's pool holds ready sandboxes and
// returns its stats.
func waitPool(t *testing.T, im *sandbox.Images, name string, ready int) sandbox.PoolStat {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		for _, s := range im.PoolStats() {
			if s.Template == name && s.Ready == ready {
				return s
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool %s never had %d ready: %+v", name, ready, im.PoolStats())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A create claims a ready sandbox from the pool: running, with the
// request's env, metadata, owner and timeout, invisible until claimed;
// the pool refills; incompatible requests miss; Close destroys the pool.
func TestPool(t *testing.T) {
	requireRunsc(t)
	cfg := testConfig(t)
	requireCodeInterpreter(t, cfg)
	m, im, logs := newLoggedManager(t, cfg, runtimes(cfg.Config))
	buildWarm(t, im)
	im.StartPools(map[string]int{codeInterpreter: 1})
	waitPool(t, im, codeInterpreter, 1)
	ctx := context.Background()
	if l := m.Live(); len(l) != 0 {
		t.Errorf("pooled sandboxes are live: %+v", l)
	}
	if recs, _, err := m.List(ctx, sandbox.Filter{}); err != nil || len(recs) != 0 {
		t.Errorf("pooled sandboxes are listed: %+v %v", recs, err)
	}

	t0 := time.Now()
	e := create(t, m, sandbox.CreateOptions{Template: codeInterpreter, Owner: "alice", Timeout: 90 * time.Second,
		Env: map[string]string{"WHO": "claimed"}, Metadata: map[string]string{"k": "v"}})
	t.Logf("create from the pool: %v", time.Since(t0))
	st := waitPool(t, im, codeInterpreter, 1) // refilled
	if st.Hits != 1 || st.Misses != 0 {
		t.Errorf("pool stats after a claim: %+v", st)
	}
	sb := e.SB
	if sb.State != sandbox.StateRunning || sb.Owner != "alice" || sb.Metadata["k"] != "v" || sb.Env["WHO"] != "claimed" ||
		sb.Template != codeInterpreter || sb.ExpiresAt.Sub(t0) < 80*time.Second || sb.ExpiresAt.Sub(t0) > 100*time.Second {
		t.Errorf("claimed record: %+v", sb)
	}
	if got, err := m.Get(ctx, sb.ID); err != nil || got.Metadata["k"] != "v" {
		t.Errorf("stored record: %+v %v", got, err)
	}
	if _, r := e.Py(pandasLoaded); r != "True" {
		t.Errorf("pandas loaded = %s in a pooled warm sandbox", r)
	}
	if out, _ := e.Py(`import os; print(os.environ["WHO"], os.environ["KILN_SANDBOX_ID"])`); out != "claimed "+sb.ID.String()+"\n" {
		t.Errorf("kernel env: %q", out)
	}
	if r := e.Sh(`echo "$WHO $KILN_SANDBOX_ID $(hostname)"`); r.Stdout != "claimed "+sb.ID.String()+" "+sb.ID.String()+"\n" {
		t.Errorf("command env: %q", r.Stdout)
	}
	if l := m.Live(); len(l) != 1 || l[0].ID != sb.ID {
		t.Errorf("live after the claim: %+v", l)
	}
	if recs, _, err := m.List(ctx, sandbox.Filter{}); err != nil || len(recs) != 1 || recs[0].ID != sb.ID {
		t.Errorf("listed after the claim: %+v %v", recs, err)
	}

	// Over quota: refused, and the pooled sandbox stays in the pool.
	_, err := m.Create(ctx, sandbox.CreateOptions{Template: codeInterpreter, Owner: "alice", Quota: sandbox.Quota{MaxSandboxes: 1}})
	if !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("create over quota: %v", err)
	}
	// Other limits than the pool's: a miss, made cold.
	e2 := create(t, m, sandbox.CreateOptions{Template: codeInterpreter, Limits: sandbox.Limits{MemoryBytes: 768 << 20}})
	if _, r := e2.Py(pandasLoaded); r != "False" {
		t.Errorf("a create with other limits got a warm sandbox")
	}
	st = waitPool(t, im, codeInterpreter, 1)
	if st.Hits != 1 || st.Misses != 2 {
		t.Errorf("pool stats after a refusal and a miss: %+v", st)
	}

	// Close destroys the pooled sandbox, leaving nothing behind.
	for _, x := range []*env{e, e2} {
		if err := m.Kill(ctx, x.SB.ID); err != nil {
			t.Fatal(err)
		}
	}
	pooled, _ := stateDirs(cfg)
	if len(pooled) != 1 {
		t.Fatalf("state dirs before Close: %v, want the pooled sandbox's", pooled)
	}
	m.Close()
	assertPoolGone(t, cfg, pooled)
	if !bytes.Contains([]byte(logs.String()), []byte(`from=pool`)) {
		t.Error("no log line for the claim")
	}
}

// assertPoolGone checks that the pooled sandboxes with these ids left no
// dir, mount, cgroup or runtime state.
func assertPoolGone(t *testing.T, cfg sandbox.Config, ids []string) {
	t.Helper()
	if left, _ := stateDirs(cfg); len(left) != 0 {
		t.Errorf("state dirs left: %v", left)
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	for _, id := range ids {
		if bytes.Contains(mounts, []byte(id)) {
			t.Errorf("mounts left behind:\n%s", grepLines(mounts, id))
		}
		for _, c := range []string{"memory", "pids", "cpu"} {
			if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", c, "kiln", id)); err == nil {
				t.Errorf("cgroup %s of pooled sandbox %s left", c, id)
			}
		}
		sid, err := sandbox.ParseID(id)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := runtimes(cfg.Config)["runsc"].State(context.Background(), sid.String()); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("runtime still knows pooled sandbox %s: %v", id, err)
		}
	}
}

// Pooled sandboxes that a crash of kiln serve left behind are destroyed
// by the next start.
func TestPoolAfterCrash(t *testing.T) {
	requireRunsc(t)
	cfg := testConfig(t)
	cfg.Adopt = true
	m1, im1 := newImages(t, cfg)
	im1.StartPools(map[string]int{"base": 2})
	waitPool(t, im1, "base", 2)
	pooled, _ := stateDirs(cfg)
	if len(pooled) != 2 {
		t.Fatalf("state dirs: %v", pooled)
	}
	im1.AbandonPools()
	m1.Close()
	if left, _ := stateDirs(cfg); len(left) != 2 {
		t.Fatalf("the simulated crash removed pooled sandboxes: %v", left)
	}
	newManager(t, cfg)
	assertPoolGone(t, cfg, pooled)
}
