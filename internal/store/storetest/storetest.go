// Package storetest is the conformance suite every store.Backend passes:
// the SQLite and PostgreSQL stores run the same tests, so the server can
// rely on one set of semantics whichever the user picks.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/store"
)

// Run runs the suite. open returns a fresh, empty backend for one test and
// arranges its Close (and removal) with t.Cleanup.
func Run(t *testing.T, open func(t *testing.T) store.Backend) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s store.Backend)
	}{
		{"SandboxRoundTrip", testSandboxRoundTrip},
		{"SandboxReplace", testSandboxReplace},
		{"SandboxNotFoundAndDelete", testSandboxNotFoundAndDelete},
		{"ListFilters", testListFilters},
		{"Pagination", testPagination},
		{"PageSizeAndBadTokens", testPageSizeAndBadTokens},
		{"ConcurrentWriters", testConcurrentWriters},
		{"EndedTombstone", testEndedTombstone},
		{"DeleteEnded", testDeleteEnded},
		{"ListOrderTemplateAndTime", testListOrderTemplateAndTime},
		{"ListBoundedOverManyEnded", testListBoundedOverManyEnded},
		{"KeyRoundTrip", testKeyRoundTrip},
		{"KeyDuplicates", testKeyDuplicates},
		{"KeyNotFound", testKeyNotFound},
		{"KeyListAndRevoke", testKeyListAndRevoke},
		{"SnapshotRoundTrip", testSnapshotRoundTrip},
		{"SnapshotNames", testSnapshotNames},
		{"SnapshotListAndDelete", testSnapshotListAndDelete},
		{"TemplateBuildRoundTrip", testBuildRoundTrip},
		{"TemplateBuildNotFoundAndDelete", testBuildNotFoundAndDelete},
		{"TemplateBuildList", testBuildList},
		{"TemplateBuildListBounded", testBuildListBounded},
		{"TemplateBuildsIn", testBuildsIn},
		{"TemplateTagRoundTripAndReplace", testTagRoundTripAndReplace},
		{"TemplateTagOwners", testTagOwners},
		{"TemplateTagPublic", testTagPublic},
		{"VolumeRoundTrip", testVolumeRoundTrip},
		{"VolumeNamesAndList", testVolumeNamesAndList},
		{"VolumeInUse", testVolumeInUse},
		{"NodeRegistry", testNodeRegistry},
		{"NodeLost", testNodeLost},
		{"NodeReserve", testNodeReserve},
		{"NodeQuota", testNodeQuota},
		{"NodePools", testNodePools},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.fn(t, open(t)) })
	}
}

// base has nanoseconds on purpose: stores keep microseconds.
var base = time.Date(2025, 3, 14, 15, 9, 26, 535897932, time.UTC)

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// stored is what a store gives back for s: times in UTC truncated to the
// microsecond, empty maps as nil.
func stored(s sandbox.Sandbox) sandbox.Sandbox {
	s.CreatedAt = s.CreatedAt.Truncate(time.Microsecond).UTC()
	if !s.ExpiresAt.IsZero() {
		s.ExpiresAt = s.ExpiresAt.Truncate(time.Microsecond).UTC()
	}
	if !s.PausedAt.IsZero() {
		s.PausedAt = s.PausedAt.Truncate(time.Microsecond).UTC()
	}
	if !s.EndedAt.IsZero() {
		s.EndedAt = s.EndedAt.Truncate(time.Microsecond).UTC()
	}
	s.Timeout = s.Timeout.Truncate(time.Millisecond)
	if s.State.Terminal() { // a tombstone: see sandbox.Store
		s.Env, s.Metadata = nil, nil
	}
	if len(s.Env) == 0 {
		s.Env = nil
	}
	if len(s.Metadata) == 0 {
		s.Metadata = nil
	}
	return s
}

func record(id string, created time.Time) sandbox.Sandbox {
	return sandbox.Sandbox{
		ID: sandbox.ID(id), Template: "base", Runtime: "runsc", State: sandbox.StateRunning,
		Limits: sandbox.Limits{CPUs: 1, MemoryBytes: 512 << 20, DiskBytes: 1 << 30, Pids: 256},
		User:   "user", Workdir: "/home/user", CreatedAt: created,
	}
}

func put(t *testing.T, s store.Backend, sbs ...sandbox.Sandbox) {
	t.Helper()
	for _, sb := range sbs {
		if err := s.PutSandbox(ctx(t), sb); err != nil {
			t.Fatalf("PutSandbox(%s): %v", sb.ID, err)
		}
	}
}

func get(t *testing.T, s store.Backend, id sandbox.ID) sandbox.Sandbox {
	t.Helper()
	sb, err := s.GetSandbox(ctx(t), id)
	if err != nil {
		t.Fatalf("GetSandbox(%s): %v", id, err)
	}
	return sb
}

func ids(sbs []sandbox.Sandbox) []string {
	out := make([]string, len(sbs))
	for i, sb := range sbs {
		out[i] = string(sb.ID)
	}
	return out
}

func testSandboxRoundTrip(t *testing.T, s store.Backend) {
	full := sandbox.Sandbox{
		ID: "rtfull0000001", Template: "python-3.12", Build: "bq2m4tyd7sk3n5wbxw6f4rpla", Runtime: "runc", State: sandbox.StatePaused,
		Reason: "agent did not answer: 'quoted' \"double\" ünïcode",
		Limits: sandbox.Limits{CPUs: 0.25, MemoryBytes: 3<<30 + 7, DiskBytes: 10 << 30, Pids: 4096},
		User:   "root", Workdir: "/srv/app dir",
		Env:      map[string]string{"PATH": "/usr/bin:/bin", "EMPTY": "", "QUOTE": `a"b\c`, "UNI": "ü→✓"},
		Metadata: map[string]string{"run": "42", "a.b": "dotted", "$weird key": "x y", "empty": ""},
		Owner:    "key_0123456789ab", Node: "host-1",
		CreatedAt: base,
		ExpiresAt: base.Add(90*time.Minute + 123456789*time.Nanosecond),
		AutoPause: true, AutoResume: true, Timeout: 5*time.Minute + 1500*time.Microsecond,
		PausedAt: base.Add(time.Hour + 987654321*time.Nanosecond),
	}
	local := full
	local.ID = "rtlocal000001"
	local.CreatedAt = base.In(time.FixedZone("UTC+5:30", 5*3600+1800))
	local.ExpiresAt = time.Time{}
	local.AutoPause = false // the two flags are separate columns
	bare := sandbox.Sandbox{ID: "rtbare0000001", State: sandbox.StateCreating, CreatedAt: base}
	emptyMaps := record("rtempty000001", base)
	emptyMaps.Env, emptyMaps.Metadata = map[string]string{}, map[string]string{}
	ended := full
	ended.ID, ended.State = "rtended00001", sandbox.StateFailed
	ended.EndedAt = base.Add(2*time.Hour + 4242*time.Nanosecond)

	for _, in := range []sandbox.Sandbox{full, local, bare, emptyMaps, ended} {
		t.Run(string(in.ID), func(t *testing.T) {
			put(t, s, in)
			got := get(t, s, in.ID)
			if diff := cmp.Diff(stored(in), got); diff != "" {
				t.Errorf("round trip (-want +got):\n%s", diff)
			}
			if got.CreatedAt.Location() != time.UTC {
				t.Errorf("CreatedAt location = %v, want UTC", got.CreatedAt.Location())
			}
			if in.ExpiresAt.IsZero() != got.ExpiresAt.IsZero() {
				t.Errorf("ExpiresAt zero = %v, want %v", got.ExpiresAt.IsZero(), in.ExpiresAt.IsZero())
			}
			if got.CreatedAt.Nanosecond()%1000 != 0 || got.CreatedAt.Nanosecond() == 0 {
				t.Errorf("CreatedAt = %v, want microsecond precision kept", got.CreatedAt)
			}
		})
	}
}

func testSandboxReplace(t *testing.T, s store.Backend) {
	sb := record("replace000001", base)
	sb.Metadata = map[string]string{"phase": "one", "keep": "yes"}
	put(t, s, sb)

	sb.State, sb.Reason = sandbox.StatePaused, "auto-paused"
	sb.Metadata = map[string]string{"phase": "two"}
	sb.ExpiresAt = base.Add(time.Hour)
	put(t, s, sb)

	if diff := cmp.Diff(stored(sb), get(t, s, sb.ID)); diff != "" {
		t.Errorf("after replace (-want +got):\n%s", diff)
	}
	for _, tc := range []struct {
		meta map[string]string
		want int
	}{
		{map[string]string{"phase": "one"}, 0},
		{map[string]string{"keep": "yes"}, 0},
		{map[string]string{"phase": "two"}, 1},
	} {
		got, _, err := s.ListSandboxes(ctx(t), sandbox.Filter{Metadata: tc.meta})
		if err != nil {
			t.Fatalf("ListSandboxes: %v", err)
		}
		if len(got) != tc.want {
			t.Errorf("metadata %v after replace: %d records, want %d", tc.meta, len(got), tc.want)
		}
	}
	all, _, err := s.ListSandboxes(ctx(t), sandbox.Filter{})
	if err != nil || len(all) != 1 {
		t.Errorf("ListSandboxes after replace = %d records, %v; want 1", len(all), err)
	}
}

func testSandboxNotFoundAndDelete(t *testing.T, s store.Backend) {
	if _, err := s.GetSandbox(ctx(t), "missing000001"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("GetSandbox(missing) = %v, want ErrNotFound", err)
	}
	if err := s.DeleteSandbox(ctx(t), "missing000001"); err != nil {
		t.Errorf("DeleteSandbox(missing) = %v, want nil", err)
	}
	a, b := record("delete00000a", base), record("delete00000b", base.Add(time.Second))
	a.Metadata = map[string]string{"k": "v"}
	put(t, s, a, b)
	if err := s.DeleteSandbox(ctx(t), a.ID); err != nil {
		t.Fatalf("DeleteSandbox: %v", err)
	}
	if _, err := s.GetSandbox(ctx(t), a.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("GetSandbox(deleted) = %v, want ErrNotFound", err)
	}
	get(t, s, b.ID) // the other one survives
	// A re-created record does not inherit the deleted one's metadata.
	a.Metadata = nil
	put(t, s, a)
	got, _, err := s.ListSandboxes(ctx(t), sandbox.Filter{Metadata: map[string]string{"k": "v"}})
	if err != nil || len(got) != 0 {
		t.Errorf("metadata of deleted record still matches: %v, %v", ids(got), err)
	}
}

// fixture is a spread of records over owners, nodes, states and metadata.
func fixture() []sandbox.Sandbox {
	owners := []string{"", "key_alice", "key_bob"}
	nodes := []string{"node-a", "node-b"}
	states := []sandbox.State{sandbox.StateRunning, sandbox.StatePaused, sandbox.StateStopped, sandbox.StateFailed}
	var out []sandbox.Sandbox
	for i := range 24 {
		sb := record(fmt.Sprintf("fixture%06d", i), base.Add(time.Duration(i)*time.Millisecond))
		sb.Owner, sb.Node, sb.State = owners[i%3], nodes[i%2], states[i%4]
		sb.Metadata = map[string]string{"run": fmt.Sprint(i % 3), "team": []string{"rl", "eval"}[i%2]}
		if i%5 == 0 {
			sb.Metadata["flag"] = "on"
		}
		out = append(out, sb)
	}
	return out
}

// matches is the reference semantics of sandbox.Filter.
func matches(sb sandbox.Sandbox, f sandbox.Filter) bool {
	if f.Owner != "" && sb.Owner != f.Owner || f.Node != "" && sb.Node != f.Node {
		return false
	}
	if len(f.States) > 0 && !slices.Contains(f.States, sb.State) {
		return false
	}
	md := stored(sb).Metadata // ended records keep none
	for k, v := range f.Metadata {
		if got, ok := md[k]; !ok || got != v {
			return false
		}
	}
	return true
}

func testListFilters(t *testing.T, s store.Backend) {
	recs := fixture()
	put(t, s, recs...)
	tests := []struct {
		name string
		f    sandbox.Filter
	}{
		{"all", sandbox.Filter{}},
		{"owner", sandbox.Filter{Owner: "key_alice"}},
		{"unknown owner", sandbox.Filter{Owner: "key_nobody"}},
		{"node", sandbox.Filter{Node: "node-b"}},
		{"one state", sandbox.Filter{States: []sandbox.State{sandbox.StatePaused}}},
		{"two states", sandbox.Filter{States: []sandbox.State{sandbox.StateRunning, sandbox.StateFailed}}},
		{"metadata pair", sandbox.Filter{Metadata: map[string]string{"run": "1"}}},
		{"metadata two pairs", sandbox.Filter{Metadata: map[string]string{"run": "2", "team": "rl"}}},
		{"metadata sparse key", sandbox.Filter{Metadata: map[string]string{"flag": "on"}}},
		{"metadata no match", sandbox.Filter{Metadata: map[string]string{"run": "9"}}},
		{"metadata value is not a key", sandbox.Filter{Metadata: map[string]string{"rl": "team"}}},
		{"everything", sandbox.Filter{Owner: "key_bob", Node: "node-a",
			States: []sandbox.State{sandbox.StateRunning, sandbox.StateStopped}, Metadata: map[string]string{"team": "rl"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := []string{}
			for _, sb := range recs {
				if matches(sb, tt.f) {
					want = append(want, string(sb.ID))
				}
			}
			got, token, err := s.ListSandboxes(ctx(t), tt.f)
			if err != nil {
				t.Fatalf("ListSandboxes: %v", err)
			}
			if token != "" {
				t.Errorf("token = %q, want \"\" (one page)", token)
			}
			if diff := cmp.Diff(want, append([]string{}, ids(got)...)); diff != "" {
				t.Errorf("ids (-want +got):\n%s", diff)
			}
		})
	}
}

// testPagination walks pages of 7 over records that share creation times,
// so the id tie-break matters, and changes the set between pages.
func testPagination(t *testing.T, s store.Backend) {
	var recs []sandbox.Sandbox
	for i := range 30 {
		// Three records per instant; ids deliberately not in time order.
		created := base.Add(time.Duration(i/3) * time.Second)
		recs = append(recs, record(fmt.Sprintf("page%02d%06d", 29-i, i), created))
	}
	put(t, s, recs...)
	sort.Slice(recs, func(i, j int) bool {
		a, b := recs[i], recs[j]
		return a.CreatedAt.Before(b.CreatedAt) || a.CreatedAt.Equal(b.CreatedAt) && a.ID < b.ID
	})
	want := ids(recs)

	var got []string
	f := sandbox.Filter{Limit: 7}
	for pages := 0; ; pages++ {
		if pages > 10 {
			t.Fatal("pagination does not end")
		}
		page, token, err := s.ListSandboxes(ctx(t), f)
		if err != nil {
			t.Fatalf("ListSandboxes page %d: %v", pages, err)
		}
		if len(page) > 7 {
			t.Fatalf("page %d has %d records, limit 7", pages, len(page))
		}
		got = append(got, ids(page)...)
		if pages == 1 {
			// Between pages: a record older than the cursor appears and one
			// not yet seen goes. Neither repeats nor skips others.
			put(t, s, record("pageold000001", base.Add(-time.Hour)))
			if err := s.DeleteSandbox(ctx(t), sandbox.ID(want[20])); err != nil {
				t.Fatal(err)
			}
		}
		if token == "" {
			break
		}
		f.Token = token
	}
	want = slices.Delete(slices.Clone(want), 20, 21)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("paged ids (-want +got):\n%s", diff)
	}

	// An exact multiple of the page size ends with an empty token, not an
	// empty page.
	all, _, err := s.ListSandboxes(ctx(t), sandbox.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	page, token, err := s.ListSandboxes(ctx(t), sandbox.Filter{Limit: len(all)})
	if err != nil || token != "" || len(page) != len(all) {
		t.Errorf("full page: %d records, token %q, err %v; want %d, \"\", nil", len(page), token, err, len(all))
	}
	// Filters apply on every page.
	f = sandbox.Filter{Limit: 2, Owner: "nobody"}
	if page, token, err := s.ListSandboxes(ctx(t), f); err != nil || len(page) != 0 || token != "" {
		t.Errorf("filtered to nothing: %v, %q, %v", ids(page), token, err)
	}
}

func testPageSizeAndBadTokens(t *testing.T, s store.Backend) {
	var recs []sandbox.Sandbox
	for i := range 105 {
		recs = append(recs, record(fmt.Sprintf("size%08d", i), base.Add(time.Duration(i)*time.Microsecond)))
	}
	put(t, s, recs...)
	for _, tc := range []struct {
		limit, want int
		more        bool
	}{{0, 100, true}, {1, 1, true}, {5000, 105, false}} {
		page, token, err := s.ListSandboxes(ctx(t), sandbox.Filter{Limit: tc.limit})
		if err != nil {
			t.Fatalf("limit %d: %v", tc.limit, err)
		}
		if len(page) != tc.want || (token != "") != tc.more {
			t.Errorf("limit %d: %d records, token %q; want %d, more=%v", tc.limit, len(page), token, tc.want, tc.more)
		}
	}
	if _, _, err := s.ListSandboxes(ctx(t), sandbox.Filter{Limit: -1}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("limit -1: %v, want ErrInvalidArgument", err)
	}
	for _, tok := range []string{"!!!not base64!!!", "AAAA", "AAAAAAAAAAA", "===="} {
		if _, _, err := s.ListSandboxes(ctx(t), sandbox.Filter{Token: tok}); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("token %q: %v, want ErrInvalidArgument", tok, err)
		}
	}
}

func testConcurrentWriters(t *testing.T, s store.Backend) {
	const writers, each = 20, 10
	shared := record("shared0000001", base)
	put(t, s, shared)
	var wg sync.WaitGroup
	errc := make(chan error, writers*each*3)
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				sb := record(fmt.Sprintf("conc%03d%04d", w, i), base.Add(time.Duration(w*each+i)*time.Millisecond))
				sb.Metadata = map[string]string{"writer": fmt.Sprint(w)}
				if err := s.PutSandbox(ctx(t), sb); err != nil {
					errc <- err
				}
				up := shared
				up.Reason = fmt.Sprintf("writer %d step %d", w, i)
				if err := s.PutSandbox(ctx(t), up); err != nil {
					errc <- err
				}
				if _, err := s.GetSandbox(ctx(t), sb.ID); err != nil {
					errc <- err
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	all, _, err := s.ListSandboxes(ctx(t), sandbox.Filter{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != writers*each+1 {
		t.Errorf("%d records after concurrent writes, want %d", len(all), writers*each+1)
	}
	mine, _, err := s.ListSandboxes(ctx(t), sandbox.Filter{Metadata: map[string]string{"writer": "7"}})
	if err != nil || len(mine) != each {
		t.Errorf("writer 7's records: %d, %v; want %d", len(mine), err, each)
	}
}
