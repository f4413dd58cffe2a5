package sandbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/sandbox/sandboxtest"
)

// TestRetention: a sandbox that ends keeps its record without its env and
// metadata; the reaper deletes the records of sandboxes that ended more
// than RetainEnded ago, and only those.
func TestRetention(t *testing.T) {
	cfg := testConfig(t)
	cfg.Limits.RetainEnded = time.Hour
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	now := time.Now().UTC()
	rec := func(id string, state sandbox.State, ended time.Time) sandbox.Sandbox {
		return sandbox.Sandbox{ID: sandbox.ID(id), Template: "base", Runtime: "runc", State: state, Reason: "killed",
			Owner: "key_x", CreatedAt: now.Add(-3 * time.Hour), EndedAt: ended}
	}
	old := []sandbox.Sandbox{
		rec("retainold0001", sandbox.StateStopped, now.Add(-2*time.Hour)),
		rec("retainold0002", sandbox.StateFailed, now.Add(-61*time.Minute)),
	}
	kept := []sandbox.Sandbox{
		rec("retainnew0001", sandbox.StateStopped, now.Add(-59*time.Minute)),
		// Live records are never deleted, however old.
		rec("retainrun0001", sandbox.StateRunning, time.Time{}),
	}
	for _, sb := range append(old, kept...) {
		if err := cfg.Store.PutSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	m := sandboxtest.NewManager(t, cfg)

	sb, err := m.Create(ctx, sandbox.CreateOptions{Runtime: "runc",
		Env: map[string]string{"TOKEN": "secret"}, Metadata: map[string]string{"job": strings.Repeat("x", 4096)}})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	got, err := m.Get(ctx, sb.ID)
	if err != nil {
		t.Fatalf("Get after kill: %v", err)
	}
	if got.State != sandbox.StateStopped || got.Reason != "killed" || got.Owner != sb.Owner || got.Template != "base" ||
		!got.CreatedAt.Equal(sb.CreatedAt.Truncate(time.Microsecond)) {
		t.Errorf("ended record = %+v, want id, owner, template, state, reason and times kept", got)
	}
	if got.Env != nil || got.Metadata != nil {
		t.Errorf("ended record kept env %v and %d metadata pairs", got.Env, len(got.Metadata))
	}
	if got.EndedAt.IsZero() || got.EndedAt.Before(now.Truncate(time.Microsecond)) {
		t.Errorf("EndedAt = %v, want the time of the kill", got.EndedAt)
	}

	// The reaper's first round runs within a second of the start.
	deadline := time.Now().Add(60 * time.Second)
	for _, sb := range old {
		for {
			_, err := cfg.Store.GetSandbox(ctx, sb.ID)
			if errors.Is(err, errdefs.ErrNotFound) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if time.Now().After(deadline) {
				t.Fatalf("record %s, ended %v ago, still there after 60 s", sb.ID, now.Sub(sb.EndedAt))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	for _, id := range []sandbox.ID{kept[0].ID, kept[1].ID, sb.ID} {
		if _, err := cfg.Store.GetSandbox(ctx, id); err != nil {
			t.Errorf("record %s within the retention period: %v", id, err)
		}
	}
}

// TestMetadataCaps: every create path refuses metadata or env over the
// caps with invalid_argument and a short message, and takes them at the
// caps.
func TestMetadataCaps(t *testing.T) {
	cfg := testConfig(t)
	m := sandboxtest.NewManager(t, cfg)
	ctx := context.Background()
	pairs := func(n, valueLen int) map[string]string {
		md := map[string]string{}
		for i := range n {
			md[string(rune('a'+i/26))+string(rune('a'+i%26))] = strings.Repeat("v", valueLen)
		}
		return md
	}
	// A snapshot record (its files are never reached: the checks come
	// first).
	if err := cfg.Store.PutSnapshot(ctx, sandbox.Snapshot{ID: "snapcaps0001", Name: "caps", Source: "capssource01",
		Template: "base", Runtime: "runsc", Metadata: pairs(60, 1), CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("k", 100_000)
	for _, tc := range []struct {
		name string
		opts sandbox.CreateOptions
	}{
		{"too many pairs", sandbox.CreateOptions{Metadata: pairs(sandbox.MaxMetadataPairs+1, 1)}},
		{"key too long", sandbox.CreateOptions{Metadata: map[string]string{big: "v"}}},
		{"empty key", sandbox.CreateOptions{Metadata: map[string]string{"": "v"}}},
		{"value too long", sandbox.CreateOptions{Metadata: map[string]string{"k": strings.Repeat("v", sandbox.MaxMetadataValueBytes+1)}}},
		{"total too large", sandbox.CreateOptions{Metadata: pairs(5, sandbox.MaxMetadataValueBytes)}},
		{"env too large", sandbox.CreateOptions{Env: pairs(3, 30<<10)}},
		{"from a snapshot", sandbox.CreateOptions{Snapshot: "caps", Metadata: pairs(sandbox.MaxMetadataPairs+1, 1)}},
		// The snapshot's 60 pairs and the request's 10 make 70.
		{"from a snapshot, merged", sandbox.CreateOptions{Snapshot: "caps", Metadata: map[string]string{
			"m0": "", "m1": "", "m2": "", "m3": "", "m4": "", "m5": "", "m6": "", "m7": "", "m8": "", "m9": ""}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.opts.Snapshot == "" {
				tc.opts.Runtime = "runc"
			}
			_, err := m.Create(ctx, tc.opts)
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("Create = %v, want invalid argument", err)
			}
			t.Log(err)
			if len(err.Error()) > 200 {
				t.Errorf("message of %d bytes: %.80q...", len(err.Error()), err.Error())
			}
		})
	}
	// Exactly at the caps: 64 pairs of 16 KiB in all.
	md := pairs(sandbox.MaxMetadataPairs, sandbox.MaxMetadataBytes/sandbox.MaxMetadataPairs-2)
	sb := sandboxtest.Create(t, m, sandbox.CreateOptions{Runtime: "runc", Metadata: md})
	if len(sb.SB.Metadata) != sandbox.MaxMetadataPairs {
		t.Errorf("created with %d metadata pairs, want %d", len(sb.SB.Metadata), sandbox.MaxMetadataPairs)
	}
}
