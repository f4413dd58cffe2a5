package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/store"
)

func snapshot(id, owner, name string, created time.Time) sandbox.Snapshot {
	return sandbox.Snapshot{
		ID: id, Name: name, Owner: owner, Source: "srcbox000000001", Template: "code-interpreter", Build: "bq2m4tyd7sk3n5wbxw6f4rpla", Runtime: "runsc",
		Limits: sandbox.Limits{CPUs: 0.5, MemoryBytes: 256 << 20, DiskBytes: 1 << 30, Pids: 512},
		User:   "user", Workdir: "/home/user",
		Env:       map[string]string{"A": "1", "UNI": "ü→✓"},
		Metadata:  map[string]string{"job": "x y"},
		SizeBytes: 123<<20 + 7, Node: "host-1", CreatedAt: created, Image: "snapshots/" + id + "@sha256:ab",
	}
}

func storedSnapshot(s sandbox.Snapshot) sandbox.Snapshot {
	s.CreatedAt = s.CreatedAt.Truncate(time.Microsecond).UTC()
	if len(s.Env) == 0 {
		s.Env = nil
	}
	if len(s.Metadata) == 0 {
		s.Metadata = nil
	}
	return s
}

func testSnapshotRoundTrip(t *testing.T, s store.Backend) {
	full := snapshot("snapfull000001", "key_a", "before-training.v2", base)
	bare := sandbox.Snapshot{ID: "snapbare000001", Name: "bare", CreatedAt: base.In(time.FixedZone("X", 3600))}
	for _, in := range []sandbox.Snapshot{full, bare} {
		if err := s.PutSnapshot(ctx(t), in); err != nil {
			t.Fatalf("PutSnapshot(%s): %v", in.ID, err)
		}
		got, err := s.GetSnapshot(ctx(t), in.Owner, in.Name)
		if err != nil {
			t.Fatalf("GetSnapshot(%s): %v", in.Name, err)
		}
		if diff := cmp.Diff(storedSnapshot(in), got); diff != "" {
			t.Errorf("round trip (-want +got):\n%s", diff)
		}
	}
}

// Names are unique per owner; another owner may reuse one, and cannot
// see the first owner's.
func testSnapshotNames(t *testing.T, s store.Backend) {
	a := snapshot("snapnamea00001", "key_a", "same", base)
	for _, sn := range []sandbox.Snapshot{a, snapshot("snapnameb00001", "key_b", "same", base)} {
		if err := s.PutSnapshot(ctx(t), sn); err != nil {
			t.Fatalf("PutSnapshot(%s): %v", sn.ID, err)
		}
	}
	for _, dup := range []sandbox.Snapshot{
		snapshot("snapnamea00002", "key_a", "same", base),  // name taken for this owner
		snapshot("snapnamea00001", "key_c", "other", base), // id taken
	} {
		if err := s.PutSnapshot(ctx(t), dup); !errors.Is(err, errdefs.ErrAlreadyExists) {
			t.Errorf("PutSnapshot(%s %s/%s) = %v, want ErrAlreadyExists", dup.ID, dup.Owner, dup.Name, err)
		}
	}
	for _, q := range []struct{ owner, name string }{{"key_c", "same"}, {"key_a", "nope"}, {"", "same"}} {
		if _, err := s.GetSnapshot(ctx(t), q.owner, q.name); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("GetSnapshot(%q, %q) = %v, want ErrNotFound", q.owner, q.name, err)
		}
	}
	got, err := s.GetSnapshot(ctx(t), "key_a", "same")
	if err != nil || got.ID != a.ID {
		t.Errorf("GetSnapshot(key_a, same) = %s, %v", got.ID, err)
	}
}

func testSnapshotListAndDelete(t *testing.T, s store.Backend) {
	in := []sandbox.Snapshot{
		snapshot("snaplist000003", "key_a", "c", base.Add(2*time.Second)),
		snapshot("snaplist000001", "key_a", "a", base),
		snapshot("snaplist000002", "key_b", "b", base.Add(time.Second)),
		snapshot("snaplist000000", "key_a", "a0", base), // same instant: by id
	}
	for _, sn := range in {
		if err := s.PutSnapshot(ctx(t), sn); err != nil {
			t.Fatal(err)
		}
	}
	names := func(owner string) []string {
		t.Helper()
		sns, err := s.ListSnapshots(ctx(t), owner)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, sn := range sns {
			out = append(out, sn.Name)
		}
		return out
	}
	if got, want := names(""), []string{"a0", "a", "b", "c"}; !cmp.Equal(got, want) {
		t.Errorf("ListSnapshots(all) = %v, want %v", got, want)
	}
	if got, want := names("key_a"), []string{"a0", "a", "c"}; !cmp.Equal(got, want) {
		t.Errorf("ListSnapshots(key_a) = %v, want %v", got, want)
	}
	if got := names("key_none"); len(got) != 0 {
		t.Errorf("ListSnapshots(key_none) = %v", got)
	}
	for range 2 { // deleting twice succeeds
		if err := s.DeleteSnapshot(ctx(t), "snaplist000001"); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := names("key_a"), []string{"a0", "c"}; !cmp.Equal(got, want) {
		t.Errorf("after delete: %v, want %v", got, want)
	}
	// The name is free again.
	if err := s.PutSnapshot(ctx(t), snapshot("snaplist000009", "key_a", "a", base)); err != nil {
		t.Errorf("reusing a deleted snapshot's name: %v", err)
	}
}
