package storetest

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/store"
	"github.com/kiln-sh/kiln/internal/store/page"
	"github.com/kiln-sh/kiln/internal/template"
)

// build is a build record with every field set.
func build(id, owner, name string, created time.Time) template.BuildRecord {
	return template.BuildRecord{
		ID: id, Template: name, Owner: owner, Status: template.BuildReady,
		Spec: api.TemplateSpec{
			From: api.TemplateBase{Template: "code-interpreter:v2"},
			Steps: []api.TemplateStep{
				{Type: api.StepRun, Args: []string{`apt-get install -y cowsay && echo "ü→✓" 'q'`, "root"}, Line: 2},
				{Type: api.StepCopy, Args: []string{"data/*.csv", "/home/user/data", "user:user", "0644"},
					FilesHash: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", Force: true, Line: 3},
				{Type: api.StepEnv, Args: []string{"EMPTY", "", "PATH", "/usr/bin:/bin"}},
			},
			StartCmd: "python3 -m http.server 8000", ReadyCmd: "curl -sf localhost:8000", NoCache: true,
		},
		Reason: "", Step: -1,
		Layers: []string{"sha256:aaaa", "sha256:bbbb"},
		Config: template.Config{
			Defaults: template.Defaults{User: "user", Workdir: "/home/user/app dir",
				Env:  map[string]string{"A": "1", "EMPTY": "", "QUOTE": `a"b\c`},
				CPUs: 0.25, MemoryBytes: 3<<30 + 7, DiskBytes: 10 << 30, Network: "nat"},
			StartCmd: "python3 -m http.server 8000", ReadyCmd: "curl -sf localhost:8000",
		},
		StepsDone: 3, CachedSteps: 2,
		Node: "host-1", Image: "registry.internal:5000/kiln/key_a/app:" + id + "@sha256:" + strings.Repeat("ab", 32),
		CreatedAt: created, StartedAt: created.Add(1500*time.Millisecond + 777*time.Nanosecond),
		FinishedAt: created.Add(93*time.Second + 4242*time.Nanosecond),
	}
}

// storedBuild is what a store gives back for b: times in UTC truncated to
// the microsecond, no registry credentials, empty lists and maps as nil.
func storedBuild(b template.BuildRecord) template.BuildRecord {
	b.CreatedAt = b.CreatedAt.Truncate(time.Microsecond).UTC()
	if !b.FinishedAt.IsZero() {
		b.FinishedAt = b.FinishedAt.Truncate(time.Microsecond).UTC()
	}
	if !b.StartedAt.IsZero() {
		b.StartedAt = b.StartedAt.Truncate(time.Microsecond).UTC()
	}
	b.Spec.From.Registry = nil
	b.Spec.Steps = append([]api.TemplateStep(nil), b.Spec.Steps...)
	for i := range b.Spec.Steps {
		if len(b.Spec.Steps[i].Args) == 0 {
			b.Spec.Steps[i].Args = nil
		}
	}
	if len(b.Spec.Steps) == 0 {
		b.Spec.Steps = nil
	}
	if len(b.Layers) == 0 {
		b.Layers = nil
	}
	if len(b.Config.Env) == 0 {
		b.Config.Env = nil
	}
	return b
}

func putBuild(t *testing.T, s store.Backend, bs ...template.BuildRecord) {
	t.Helper()
	for _, b := range bs {
		if err := s.PutBuild(ctx(t), b); err != nil {
			t.Fatalf("PutBuild(%s): %v", b.ID, err)
		}
	}
}

func buildIDs(bs []template.BuildRecord) []string {
	out := []string{}
	for _, b := range bs {
		out = append(out, b.ID)
	}
	return out
}

func testBuildRoundTrip(t *testing.T, s store.Backend) {
	full := build("bld_full", "key_a", "app", base)
	full.Status, full.Reason, full.Step = template.BuildError, "step 2 (COPY data/*.csv): no such file: 'x' \"y\" ü", 1
	// Credentials are never stored.
	withCreds := build("bld_creds", "key_a", "img", base)
	withCreds.Spec.From = api.TemplateBase{Image: "registry.local:5000/team/img:1",
		Registry: &api.RegistryAuth{Username: "bob", Password: "hunter2"}}
	// Still running: no finish time, no failed step, nothing built yet.
	waiting := build("bld_waiting", "key_a", "app", base.In(time.FixedZone("UTC+5:30", 5*3600+1800)))
	waiting.Status, waiting.FinishedAt, waiting.Step, waiting.Layers = template.BuildWaiting, time.Time{}, -1, nil
	waiting.StartedAt, waiting.StepsDone, waiting.CachedSteps = time.Time{}, 0, 0
	waiting.Config = template.Config{}
	bare := template.BuildRecord{ID: "bld_bare", CreatedAt: base}
	empty := build("bld_empty", "", "base", base)
	empty.Layers, empty.Config.Env = []string{}, map[string]string{}
	empty.Spec.Steps = []api.TemplateStep{{Type: api.StepRun, Args: []string{}}}

	for _, in := range []template.BuildRecord{full, withCreds, waiting, bare, empty} {
		t.Run(in.ID, func(t *testing.T) {
			putBuild(t, s, in)
			got, err := s.GetBuild(ctx(t), in.ID)
			if err != nil {
				t.Fatalf("GetBuild: %v", err)
			}
			if diff := cmp.Diff(storedBuild(in), got); diff != "" {
				t.Errorf("round trip (-want +got):\n%s", diff)
			}
			if got.CreatedAt.Location() != time.UTC {
				t.Errorf("CreatedAt location = %v, want UTC", got.CreatedAt.Location())
			}
			if got.FinishedAt.IsZero() != in.FinishedAt.IsZero() || got.StartedAt.IsZero() != in.StartedAt.IsZero() {
				t.Errorf("StartedAt, FinishedAt = %v, %v; want zero %v, %v", got.StartedAt, got.FinishedAt, in.StartedAt.IsZero(), in.FinishedAt.IsZero())
			}
			if got.Spec.From.Registry != nil {
				t.Errorf("registry credentials stored: %+v", got.Spec.From.Registry)
			}
		})
	}

	// Replacing a build (it finished) rewrites every field.
	waiting.Status, waiting.Layers, waiting.Config = template.BuildReady, []string{"sha256:cccc"}, full.Config
	waiting.FinishedAt, waiting.Node, waiting.Step = base.Add(time.Minute), "host-2", -1
	waiting.Image = "127.0.0.1:5000/kiln/key_a/app:bld_waiting@sha256:" + strings.Repeat("cd", 32)
	waiting.StartedAt, waiting.StepsDone, waiting.CachedSteps = base.Add(time.Second), 3, 1
	putBuild(t, s, waiting)
	got, err := s.GetBuild(ctx(t), waiting.ID)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(storedBuild(waiting), got); diff != "" {
		t.Errorf("after replace (-want +got):\n%s", diff)
	}
}

func testBuildNotFoundAndDelete(t *testing.T, s store.Backend) {
	if _, err := s.GetBuild(ctx(t), "bld_missing"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("GetBuild(missing) = %v, want ErrNotFound", err)
	}
	a, b := build("bld_del_a", "key_a", "app", base), build("bld_del_b", "key_a", "app", base.Add(time.Second))
	putBuild(t, s, a, b)
	for range 2 { // deleting twice (and so a missing one) succeeds
		if err := s.DeleteBuild(ctx(t), a.ID); err != nil {
			t.Fatalf("DeleteBuild: %v", err)
		}
	}
	if _, err := s.GetBuild(ctx(t), a.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("GetBuild(deleted) = %v, want ErrNotFound", err)
	}
	got, err := s.ListBuilds(ctx(t), "key_a", "app", 0)
	if err != nil || !cmp.Equal(buildIDs(got), []string{b.ID}) {
		t.Errorf("ListBuilds after delete = %v, %v; want [%s]", buildIDs(got), err, b.ID)
	}
}

func testBuildList(t *testing.T, s store.Backend) {
	at := func(ms int) time.Time { return base.Add(time.Duration(ms) * time.Millisecond) }
	putBuild(t, s,
		build("bld_a_app_1", "key_a", "app", at(1)),
		build("bld_b_app_1", "key_b", "app", at(2)),
		build("bld_a_web_1", "key_a", "web", at(3)),
		build("bld_a_app_2", "key_a", "app", at(4)),
		build("bld_a_app_3", "key_a", "app", at(4)), // same instant: by id, descending
		build("bld_builtin", "", "base", at(0)),
	)
	tests := []struct {
		owner, name string
		limit       int
		want        []string
	}{
		{"key_a", "app", 0, []string{"bld_a_app_3", "bld_a_app_2", "bld_a_app_1"}},
		{"key_a", "app", 2, []string{"bld_a_app_3", "bld_a_app_2"}},
		{"key_a", "", 0, []string{"bld_a_app_3", "bld_a_app_2", "bld_a_web_1", "bld_a_app_1"}},
		{"", "app", 0, []string{"bld_a_app_3", "bld_a_app_2", "bld_b_app_1", "bld_a_app_1"}},
		{"", "", 0, []string{"bld_a_app_3", "bld_a_app_2", "bld_a_web_1", "bld_b_app_1", "bld_a_app_1", "bld_builtin"}},
		{"", "", 1, []string{"bld_a_app_3"}},
		{"key_b", "web", 0, []string{}},
		{"key_c", "", 0, []string{}},
	}
	for _, tt := range tests {
		got, err := s.ListBuilds(ctx(t), tt.owner, tt.name, tt.limit)
		if err != nil {
			t.Errorf("ListBuilds(%q, %q, %d): %v", tt.owner, tt.name, tt.limit, err)
			continue
		}
		if !cmp.Equal(buildIDs(got), tt.want) {
			t.Errorf("ListBuilds(%q, %q, %d) = %v, want %v", tt.owner, tt.name, tt.limit, buildIDs(got), tt.want)
		}
	}
	if _, err := s.ListBuilds(ctx(t), "", "", -1); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("ListBuilds(limit -1) = %v, want ErrInvalidArgument", err)
	}
}

// testBuildListBounded: a listing never returns more than page.MaxSize
// builds, and page.DefaultSize when asked for none.
func testBuildListBounded(t *testing.T, s store.Backend) {
	const n = page.MaxSize + 1
	for i := range n {
		putBuild(t, s, build(fmt.Sprintf("bld_many_%05d", i), "key_many", "app", base.Add(time.Duration(i)*time.Millisecond)))
	}
	for _, tt := range []struct{ limit, want int }{{0, page.DefaultSize}, {7, 7}, {1 << 30, page.MaxSize}} {
		got, err := s.ListBuilds(ctx(t), "key_many", "app", tt.limit)
		if err != nil || len(got) != tt.want {
			t.Errorf("ListBuilds(limit %d) = %d builds, %v; want %d", tt.limit, len(got), err, tt.want)
			continue
		}
		if newest := fmt.Sprintf("bld_many_%05d", n-1); got[0].ID != newest {
			t.Errorf("ListBuilds(limit %d) starts at %s, want the newest, %s", tt.limit, got[0].ID, newest)
		}
	}
}

func testBuildsIn(t *testing.T, s store.Backend) {
	mk := func(id, status string, ms int) template.BuildRecord {
		b := build(id, "key_a", "app", base.Add(time.Duration(ms)*time.Millisecond))
		b.Status = status
		return b
	}
	putBuild(t, s,
		mk("bld_in_building", template.BuildBuilding, 2),
		mk("bld_in_ready", template.BuildReady, 1),
		mk("bld_in_waiting", template.BuildWaiting, 3),
		mk("bld_in_error", template.BuildError, 0),
		mk("bld_in_waiting0", template.BuildWaiting, 0),
	)
	tests := []struct {
		states []string
		want   []string // oldest first
	}{
		{[]string{template.BuildWaiting, template.BuildBuilding}, []string{"bld_in_waiting0", "bld_in_building", "bld_in_waiting"}},
		{[]string{template.BuildReady}, []string{"bld_in_ready"}},
		{[]string{"no-such-state"}, []string{}},
		{nil, []string{}},
	}
	for _, tt := range tests {
		got, err := s.BuildsIn(ctx(t), tt.states...)
		if err != nil || !cmp.Equal(buildIDs(got), tt.want) {
			t.Errorf("BuildsIn(%v) = %v, %v; want %v", tt.states, buildIDs(got), err, tt.want)
		}
	}
}

// durableBuilds are what PutTemplateRecords writes: a ready build with
// every field set, and one interrupted mid-build.
func durableBuilds() []template.BuildRecord {
	ready := build("bld_durable_ready", "key_durable", "app", base)
	building := build("bld_durable_building", "key_durable", "app", base.Add(time.Second))
	building.Status, building.FinishedAt, building.Layers, building.Config = template.BuildBuilding, time.Time{}, nil, template.Config{}
	building.StepsDone, building.CachedSteps = 0, 0
	return []template.BuildRecord{ready, building}
}

var durableTag = template.TagRecord{Owner: "key_durable", Name: "app", Tag: template.DefaultTag,
	BuildID: "bld_durable_ready", Public: true, UpdatedAt: base}

// PutTemplateRecords writes template records for CheckTemplateRecords to
// find after the store is reopened or its schema upgraded.
func PutTemplateRecords(t *testing.T, s template.Store) {
	t.Helper()
	for _, b := range durableBuilds() {
		if err := s.PutBuild(ctx(t), b); err != nil {
			t.Fatalf("PutBuild(%s): %v", b.ID, err)
		}
	}
	if err := s.PutTag(ctx(t), durableTag); err != nil {
		t.Fatalf("PutTag: %v", err)
	}
}

// CheckTemplateRecords fails t unless s holds, field for field, what
// PutTemplateRecords wrote.
func CheckTemplateRecords(t *testing.T, s template.Store) {
	t.Helper()
	want := durableBuilds()
	for _, b := range want {
		got, err := s.GetBuild(ctx(t), b.ID)
		if err != nil {
			t.Errorf("GetBuild(%s): %v", b.ID, err)
			continue
		}
		if diff := cmp.Diff(storedBuild(b), got); diff != "" {
			t.Errorf("build %s (-want +got):\n%s", b.ID, diff)
		}
	}
	if got, err := s.BuildsIn(ctx(t), template.BuildBuilding); err != nil || !cmp.Equal(buildIDs(got), []string{want[1].ID}) {
		t.Errorf("BuildsIn(building) = %v, %v; want [%s]", buildIDs(got), err, want[1].ID)
	}
	got, err := s.GetTag(ctx(t), durableTag.Owner, durableTag.Name, durableTag.Tag)
	if err != nil {
		t.Errorf("GetTag: %v", err)
	} else if diff := cmp.Diff(storedTag(durableTag), got); diff != "" {
		t.Errorf("tag (-want +got):\n%s", diff)
	}
}

// OldBuild is a build row as Kilns before schema 7 stored it, with the
// columns they had: spec is its JSON.
type OldBuild struct{ ID, Status, Spec string }

// OldBuilds are the rows a migration test inserts into a database at
// schema 6 (created at the time it passes to CheckUpgradedBuilds).
var OldBuilds = []OldBuild{
	{"bld_old_ready", template.BuildReady, `{"from":{"template":"base"},"steps":[{"type":"RUN","args":["true"]},{"type":"ENV","args":["A","1"]}]}`},
	{"bld_old_nosteps", template.BuildReady, `{"from":{"template":"base"}}`},
	{"bld_old_error", template.BuildError, `{"from":{"template":"base"},"steps":[{"type":"RUN","args":["false"]}]}`},
	{"bld_old_waiting", template.BuildWaiting, `{"from":{"template":"base"},"steps":[{"type":"RUN","args":["true"]}]}`},
}

// CheckUpgradedBuilds fails t unless schema 7 gave OldBuilds, created at
// created, a start time (their creation, unless still waiting) and the
// steps a ready build got through (all of its recipe's); how many were
// cached is not known (0).
func CheckUpgradedBuilds(t *testing.T, s template.Store, created time.Time) {
	t.Helper()
	want := map[string]struct {
		started bool
		done    int
	}{"bld_old_ready": {true, 2}, "bld_old_nosteps": {true, 0}, "bld_old_error": {true, 0}, "bld_old_waiting": {false, 0}}
	for _, old := range OldBuilds {
		b, err := s.GetBuild(ctx(t), old.ID)
		if err != nil {
			t.Errorf("GetBuild(%s): %v", old.ID, err)
			continue
		}
		w := want[old.ID]
		if b.StartedAt.Equal(created) != w.started || !w.started && !b.StartedAt.IsZero() || b.StepsDone != w.done || b.CachedSteps != 0 {
			t.Errorf("%s upgraded: started %v, steps done %d, cached %d; want started at creation (%v) %v, %d done, 0 cached",
				old.ID, b.StartedAt, b.StepsDone, b.CachedSteps, created, w.started, w.done)
		}
	}
}
