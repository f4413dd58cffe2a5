package sandbox_test

import (
	"testing"
	"time"
)

// SetPoolSizes starts the pools, grows and shrinks them (the extra
// sandboxes destroyed) and drops a pool left out, as a cluster node does
// when live nodes come and go.
func TestSetPoolSizes(t *testing.T) {
	requireRunsc(t)
	cfg := testConfig(t)
	_, im := newImages(t, cfg)
	dirs := func() int {
		t.Helper()
		d, err := stateDirs(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return len(d)
	}
	im.SetPoolSizes(map[string]int{"base": 2})
	waitPool(t, im, "base", 2)
	im.SetPoolSizes(map[string]int{"base": 1})
	if st := waitPool(t, im, "base", 1); st.Target != 1 || dirs() != 1 {
		t.Errorf("shrunk to 1: %+v, %d sandbox dirs; want target 1, 1 dir", st, dirs())
	}
	im.SetPoolSizes(map[string]int{"base": 3})
	waitPool(t, im, "base", 3)
	im.SetPoolSizes(nil)
	if st := im.PoolStats(); len(st) != 0 {
		t.Errorf("pools after sizes none: %+v", st)
	}
	for deadline := time.Now().Add(time.Minute); dirs() != 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d sandbox dirs left after the pools were dropped", dirs())
		}
	}
}
