package storetest

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/store"
	"github.com/kiln-sh/kiln/internal/store/page"
)

// testEndedTombstone: a record written in a terminal state keeps its row
// (id, owner, template, state, reason, times) but not its env and
// metadata, and gets an end time if it has none.
func testEndedTombstone(t *testing.T, s store.Backend) {
	live := record("tomb00000001", base)
	live.Owner, live.Reason = "key_alice", ""
	live.Env = map[string]string{"SECRET": "s3cr3t"}
	live.Metadata = map[string]string{"job": "big", "blob": strings.Repeat("x", 4<<10)}
	put(t, s, live)
	if got := get(t, s, live.ID); got.Metadata["job"] != "big" || got.Env["SECRET"] != "s3cr3t" || !got.EndedAt.IsZero() {
		t.Fatalf("live record lost its maps or has an end: %+v", got)
	}

	before := time.Now()
	for _, st := range []sandbox.State{sandbox.StateStopped, sandbox.StateFailed} {
		t.Run(string(st), func(t *testing.T) {
			ended := live
			ended.ID = sandbox.ID("tomb" + string(st))
			put(t, s, ended) // live first, with its env and metadata
			ended.State, ended.Reason = st, "killed"
			put(t, s, ended)
			got := get(t, s, ended.ID)
			if got.Env != nil || got.Metadata != nil {
				t.Errorf("ended record kept env %v / metadata of %d keys", got.Env, len(got.Metadata))
			}
			if got.EndedAt.Before(before.Truncate(time.Microsecond)) || got.EndedAt.After(time.Now()) {
				t.Errorf("EndedAt = %v, want the time of the write (after %v)", got.EndedAt, before)
			}
			want := stored(ended)
			want.EndedAt = got.EndedAt
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("tombstone (-want +got):\n%s", diff)
			}
			// Its metadata no longer matches a filter.
			sbs, _, err := s.ListSandboxes(ctx(t), sandbox.Filter{Metadata: map[string]string{"job": "big"}})
			if err != nil {
				t.Fatal(err)
			}
			if slices.Contains(ids(sbs), string(ended.ID)) {
				t.Errorf("ended record still matches its old metadata")
			}
			// A later write keeps the end time it was given.
			ended.EndedAt = base.Add(time.Minute)
			put(t, s, ended)
			if got, want := get(t, s, ended.ID).EndedAt, base.Add(time.Minute).Truncate(time.Microsecond); !got.Equal(want) {
				t.Errorf("EndedAt after rewrite = %v, want %v", got, want)
			}
		})
	}
}

// testDeleteEnded: only stopped and failed records that ended before the
// cutoff go, oldest end first, at most limit per call.
func testDeleteEnded(t *testing.T, s store.Backend) {
	cutoff := base.Add(24 * time.Hour)
	var old, keep []string
	for i := range 12 {
		sb := record(fmt.Sprintf("ended%07d", i), base.Add(-time.Duration(i)*time.Hour))
		sb.State = []sandbox.State{sandbox.StateStopped, sandbox.StateFailed}[i%2]
		switch {
		case i < 7: // ended long before the cutoff
			sb.EndedAt = cutoff.Add(-time.Duration(i+1) * time.Hour)
			old = append(old, string(sb.ID))
		case i < 10: // ended after it
			sb.EndedAt = cutoff.Add(time.Duration(i) * time.Minute)
			keep = append(keep, string(sb.ID))
		default: // exactly at it: not before
			sb.EndedAt = cutoff
			keep = append(keep, string(sb.ID))
		}
		put(t, s, sb)
	}
	// Live records as old as any never go, whatever their state.
	for i, st := range []sandbox.State{sandbox.StateCreating, sandbox.StateRunning, sandbox.StatePaused, sandbox.StateStopping} {
		sb := record(fmt.Sprintf("alive%07d", i), base.Add(-30*24*time.Hour))
		sb.State = st
		put(t, s, sb)
		keep = append(keep, string(sb.ID))
	}

	n, err := s.DeleteEnded(ctx(t), cutoff, 3)
	if err != nil || n != 3 {
		t.Fatalf("DeleteEnded(limit 3) = %d, %v; want 3", n, err)
	}
	// The three that ended first went: ended0000006, 5 and 4.
	for _, id := range old[4:] {
		if _, err := s.GetSandbox(ctx(t), sandbox.ID(id)); err == nil {
			t.Errorf("%s (ended earliest) survived the first batch", id)
		}
	}
	n, err = s.DeleteEnded(ctx(t), cutoff, 100)
	if err != nil || n != 4 {
		t.Fatalf("DeleteEnded(rest) = %d, %v; want 4", n, err)
	}
	if n, err := s.DeleteEnded(ctx(t), cutoff, 100); err != nil || n != 0 {
		t.Errorf("DeleteEnded(nothing due) = %d, %v; want 0", n, err)
	}
	all, _, err := s.ListSandboxes(ctx(t), sandbox.Filter{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	got := ids(all)
	slices.Sort(got)
	slices.Sort(keep)
	if diff := cmp.Diff(keep, got); diff != "" {
		t.Errorf("records left (-want +got):\n%s", diff)
	}
}

// testListOrderTemplateAndTime: newest-first pages, the template filter
// and created-after, alone and with a token.
func testListOrderTemplateAndTime(t *testing.T, s store.Backend) {
	var recs []sandbox.Sandbox
	for i := range 20 {
		sb := record(fmt.Sprintf("ord%02d%06d", 19-i, i), base.Add(time.Duration(i/2)*time.Second))
		sb.Template = []string{"base", "code-interpreter"}[i%2]
		recs = append(recs, sb)
	}
	put(t, s, recs...)
	// The reference order, newest first: time, then id, both descending.
	desc := slices.Clone(recs)
	slices.SortFunc(desc, func(a, b sandbox.Sandbox) int {
		if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
			return c
		}
		return cmpString(string(b.ID), string(a.ID))
	})
	walk := func(f sandbox.Filter) []string {
		var got []string
		for pages := 0; ; pages++ {
			if pages > 30 {
				t.Fatal("pagination does not end")
			}
			pg, tok, err := s.ListSandboxes(ctx(t), f)
			if err != nil {
				t.Fatalf("ListSandboxes(%+v): %v", f, err)
			}
			got = append(got, ids(pg)...)
			if tok == "" {
				return got
			}
			f.Token = tok
		}
	}
	after := base.Add(5*time.Second + 500*time.Millisecond)
	for _, tc := range []struct {
		name string
		f    sandbox.Filter
		keep func(sandbox.Sandbox) bool
	}{
		{"desc", sandbox.Filter{Desc: true, Limit: 3}, func(sandbox.Sandbox) bool { return true }},
		{"desc template", sandbox.Filter{Desc: true, Limit: 4, Template: "code-interpreter"},
			func(sb sandbox.Sandbox) bool { return sb.Template == "code-interpreter" }},
		{"desc created after", sandbox.Filter{Desc: true, Limit: 2, CreatedAfter: after},
			func(sb sandbox.Sandbox) bool { return sb.CreatedAt.After(after) }},
		{"created after exactly a record's time", sandbox.Filter{Desc: true, CreatedAfter: base.Add(9 * time.Second)},
			func(sb sandbox.Sandbox) bool { return false }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := []string{}
			for _, sb := range desc {
				if tc.keep(sb) {
					want = append(want, string(sb.ID))
				}
			}
			if diff := cmp.Diff(want, append([]string{}, walk(tc.f)...)); diff != "" {
				t.Errorf("ids (-want +got):\n%s", diff)
			}
		})
	}
	asc := walk(sandbox.Filter{Limit: 3, Template: "base"})
	if len(asc) != 10 || !slices.IsSortedFunc(asc, func(a, b string) int {
		return get(t, s, sandbox.ID(a)).CreatedAt.Compare(get(t, s, sandbox.ID(b)).CreatedAt)
	}) {
		t.Errorf("ascending template pages = %v", asc)
	}
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// testListBoundedOverManyEnded: with more ended records than the largest
// page, a list returns at most page.MaxSize and a token, whatever limit
// is asked for, and the pages add up to all of them.
func testListBoundedOverManyEnded(t *testing.T, s store.Backend) {
	const n = page.MaxSize + 50
	for i := range n {
		sb := record(fmt.Sprintf("many%08d", i), base.Add(time.Duration(i)*time.Millisecond))
		sb.Owner, sb.State, sb.Reason = "key_many", sandbox.StateStopped, "killed"
		sb.Metadata = map[string]string{"pad": strings.Repeat("p", 1024)}
		put(t, s, sb)
	}
	f := sandbox.Filter{Owner: "key_many", Limit: 1 << 30}
	pg, tok, err := s.ListSandboxes(ctx(t), f)
	if err != nil {
		t.Fatal(err)
	}
	if len(pg) != page.MaxSize || tok == "" {
		t.Fatalf("first page: %d records, token %q; want %d and a token", len(pg), tok, page.MaxSize)
	}
	for _, sb := range pg {
		if sb.Metadata != nil {
			t.Fatalf("ended record %s listed with metadata", sb.ID)
		}
	}
	f.Token = tok
	rest, tok, err := s.ListSandboxes(ctx(t), f)
	if err != nil || len(rest) != n-page.MaxSize || tok != "" {
		t.Errorf("second page: %d records, token %q, %v; want %d, none", len(rest), tok, err, n-page.MaxSize)
	}
}
