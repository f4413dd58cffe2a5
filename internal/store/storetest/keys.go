package storetest

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kiln-sh/kiln/internal/apikey"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/store"
)

func key(id string, created time.Time) apikey.Key {
	k, _ := apikey.New("key "+id, false)
	k.ID, k.CreatedAt = id, created
	return k
}

func createKey(t *testing.T, s store.Backend, ks ...apikey.Key) {
	t.Helper()
	for _, k := range ks {
		if err := s.CreateKey(ctx(t), k); err != nil {
			t.Fatalf("CreateKey(%s): %v", k.ID, err)
		}
	}
}

func storedKey(k apikey.Key) apikey.Key {
	k.CreatedAt = k.CreatedAt.Truncate(time.Microsecond).UTC()
	if !k.RevokedAt.IsZero() {
		k.RevokedAt = k.RevokedAt.Truncate(time.Microsecond).UTC()
	}
	return k
}

func testKeyRoundTrip(t *testing.T, s store.Backend) {
	admin, _ := apikey.New("admin ünïcode 'quoted'", true)
	admin.CreatedAt = base.In(time.FixedZone("west", -7*3600))
	admin.MaxSandboxes, admin.MaxMemoryBytes = 1<<40, 1<<50
	revoked := key("key_revoked", base.Add(time.Second))
	revoked.RevokedAt = base.Add(time.Minute + 999*time.Nanosecond)
	for _, k := range []apikey.Key{admin, revoked} {
		createKey(t, s, k)
		got, err := s.KeyByHash(ctx(t), k.Hash)
		if err != nil {
			t.Fatalf("KeyByHash(%s): %v", k.ID, err)
		}
		if diff := cmp.Diff(storedKey(k), got); diff != "" {
			t.Errorf("key %s round trip (-want +got):\n%s", k.ID, diff)
		}
		if got.CreatedAt.Location() != time.UTC {
			t.Errorf("CreatedAt location = %v, want UTC", got.CreatedAt.Location())
		}
		if got.Revoked() != k.Revoked() {
			t.Errorf("Revoked() = %v, want %v", got.Revoked(), k.Revoked())
		}
	}
}

func testKeyDuplicates(t *testing.T, s store.Backend) {
	k := key("key_dup", base)
	createKey(t, s, k)
	sameID := key("key_dup", base) // fresh hash, same id
	sameHash := key("key_other", base)
	sameHash.Hash = k.Hash
	for name, dup := range map[string]apikey.Key{"id": sameID, "hash": sameHash} {
		if err := s.CreateKey(ctx(t), dup); !errors.Is(err, errdefs.ErrAlreadyExists) {
			t.Errorf("duplicate %s: %v, want ErrAlreadyExists", name, err)
		}
	}
	ks, err := s.ListKeys(ctx(t))
	if err != nil || len(ks) != 1 {
		t.Errorf("ListKeys after duplicates = %d keys, %v; want 1", len(ks), err)
	}
}

func testKeyNotFound(t *testing.T, s store.Backend) {
	if _, err := s.KeyByHash(ctx(t), apikey.Hash("e2b_nope")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("KeyByHash(unknown) = %v, want ErrNotFound", err)
	}
	if _, err := s.KeyByHash(ctx(t), nil); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("KeyByHash(nil) = %v, want ErrNotFound", err)
	}
	if err := s.RevokeKey(ctx(t), "key_nope", base); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("RevokeKey(unknown) = %v, want ErrNotFound", err)
	}
	if ks, err := s.ListKeys(ctx(t)); err != nil || len(ks) != 0 {
		t.Errorf("ListKeys(empty) = %v, %v; want none", ks, err)
	}
}

func testKeyListAndRevoke(t *testing.T, s store.Backend) {
	// Created out of order, two at the same instant: listed by (time, id).
	a, b, c := key("key_a", base), key("key_b", base), key("key_c", base.Add(2*time.Second))
	createKey(t, s, c, b, a)
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			if err := s.CreateKey(ctx(t), key(fmt.Sprintf("key_conc%02d", i), base.Add(time.Hour))); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()

	at := base.Add(5*time.Minute + 1234*time.Nanosecond)
	if err := s.RevokeKey(ctx(t), a.ID, at); err != nil {
		t.Fatalf("RevokeKey: %v", err)
	}
	// Revoking again keeps the first time.
	if err := s.RevokeKey(ctx(t), a.ID, at.Add(time.Hour)); err != nil {
		t.Fatalf("RevokeKey again: %v", err)
	}
	ks, err := s.ListKeys(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, k := range ks {
		got = append(got, k.ID)
	}
	want := []string{"key_a", "key_b", "key_c"}
	for i := range 20 {
		want = append(want, fmt.Sprintf("key_conc%02d", i))
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ListKeys order (-want +got):\n%s", diff)
	}
	revoked, err := s.KeyByHash(ctx(t), a.Hash)
	if err != nil {
		t.Fatal(err)
	}
	a.RevokedAt = at
	if diff := cmp.Diff(storedKey(a), revoked); diff != "" {
		t.Errorf("revoked key (-want +got):\n%s", diff)
	}
	if !ks[0].Revoked() || ks[1].Revoked() {
		t.Errorf("listed revocations = %v, %v; want true, false", ks[0].Revoked(), ks[1].Revoked())
	}
}
