package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/store"
	"github.com/kiln-sh/kiln/internal/volume"
)

func vol(id, owner, name string, created time.Time) volume.Volume {
	return volume.Volume{ID: id, Name: name, Owner: owner, SizeBytes: 64 << 20, Node: "n1", CreatedAt: created}
}

func testVolumeRoundTrip(t *testing.T, s store.Backend) {
	v := vol("vol-1", "key-a", "data", base)
	if err := s.PutVolume(ctx(t), v); err != nil {
		t.Fatal(err)
	}
	want := v
	want.CreatedAt = base.Truncate(time.Microsecond)
	for _, get := range []func() (volume.Volume, error){
		func() (volume.Volume, error) { return s.GetVolume(ctx(t), "vol-1") },
		func() (volume.Volume, error) { return s.GetVolumeByName(ctx(t), "key-a", "data") },
	} {
		got, err := get()
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("volume (-want +got):\n%s", d)
		}
	}
	for _, err := range []error{
		func() error { _, err := s.GetVolume(ctx(t), "vol-2"); return err }(),
		func() error { _, err := s.GetVolumeByName(ctx(t), "key-b", "data"); return err }(),
	} {
		if !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("missing volume: %v, want not found", err)
		}
	}
}

func testVolumeNamesAndList(t *testing.T, s store.Backend) {
	put := func(v volume.Volume) error { return s.PutVolume(ctx(t), v) }
	for _, v := range []volume.Volume{
		vol("vol-2", "key-a", "b", base.Add(2*time.Second)),
		vol("vol-1", "key-a", "a", base.Add(time.Second)),
		vol("vol-3", "key-b", "a", base), // same name, other owner
		vol("vol-4", "", "a", base),      // local use
	} {
		if err := put(v); err != nil {
			t.Fatalf("PutVolume(%s): %v", v.ID, err)
		}
	}
	for _, v := range []volume.Volume{vol("vol-5", "key-a", "a", base), vol("vol-1", "key-c", "z", base)} {
		if err := put(v); !errors.Is(err, errdefs.ErrAlreadyExists) {
			t.Errorf("PutVolume(%s %s/%s) = %v, want already exists", v.ID, v.Owner, v.Name, err)
		}
	}
	for owner, want := range map[string][]string{"key-a": {"vol-1", "vol-2"}, "key-b": {"vol-3"}, "": {"vol-4"}, "key-z": nil} {
		vs, err := s.ListVolumes(ctx(t), owner)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, v := range vs {
			got = append(got, v.ID)
		}
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("ListVolumes(%q) (-want +got):\n%s", owner, d)
		}
	}
	if err := s.DeleteVolume(ctx(t), "vol-1"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteVolume(ctx(t), "vol-1"); err != nil {
		t.Errorf("deleting a missing volume: %v", err)
	}
	if _, err := s.GetVolume(ctx(t), "vol-1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("deleted volume: %v, want not found", err)
	}
}

// A volume is in use while a sandbox that mounts it has not ended:
// creating, running or paused; not once it stopped or failed, nor once
// its record is gone.
func testVolumeInUse(t *testing.T, s store.Backend) {
	for _, id := range []string{"vol-1", "vol-2"} {
		if err := s.PutVolume(ctx(t), vol(id, "key-a", id, base)); err != nil {
			t.Fatal(err)
		}
	}
	inUse := func(id string) bool {
		t.Helper()
		ok, err := s.VolumeInUse(ctx(t), id)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	sb := record("sb-1", base)
	sb.State = sandbox.StateCreating
	sb.Volumes = []sandbox.VolumeMount{{Volume: "vol-1", Path: "/data"}, {Volume: "vol-2", Path: "/ro", ReadOnly: true}}
	put(t, s, sb)
	if d := cmp.Diff(stored(sb), get(t, s, sb.ID)); d != "" {
		t.Errorf("sandbox with volumes (-want +got):\n%s", d)
	}
	if inUse("vol-1") {
		t.Fatal("vol-1 in use before any mount")
	}
	if err := s.PutVolumeMounts(ctx(t), "sb-1", []string{"vol-1", "vol-2"}); err != nil {
		t.Fatal(err)
	}
	for _, st := range []sandbox.State{sandbox.StateCreating, sandbox.StateRunning, sandbox.StatePaused} {
		sb.State = st
		put(t, s, sb)
		if !inUse("vol-1") || !inUse("vol-2") {
			t.Errorf("state %s: volumes not in use", st)
		}
	}
	sb2 := record("sb-2", base)
	put(t, s, sb2)
	if err := s.PutVolumeMounts(ctx(t), "sb-2", []string{"vol-2"}); err != nil {
		t.Fatal(err)
	}
	put(t, s, sb.Ended(sandbox.StateStopped, "killed", base))
	if inUse("vol-1") {
		t.Error("vol-1 in use after its sandbox stopped")
	}
	if !inUse("vol-2") {
		t.Error("vol-2 not in use while sb-2 runs")
	}
	if err := s.DeleteSandbox(ctx(t), "sb-2"); err != nil {
		t.Fatal(err)
	}
	if inUse("vol-2") {
		t.Error("vol-2 in use after sb-2's record was deleted")
	}
	// A deleted volume's rows go with it.
	if err := s.DeleteVolume(ctx(t), "vol-1"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSandbox(ctx(t), "sb-1"); err != nil {
		t.Fatal(err)
	}
}
