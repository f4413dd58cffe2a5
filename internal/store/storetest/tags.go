package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/store"
	"github.com/kiln-sh/kiln/internal/template"
)

func putTag(t *testing.T, s store.Backend, ts ...template.TagRecord) {
	t.Helper()
	for _, tg := range ts {
		if err := s.PutTag(ctx(t), tg); err != nil {
			t.Fatalf("PutTag(%s %s:%s): %v", tg.Owner, tg.Name, tg.Tag, err)
		}
	}
}

func tagRecord(owner, name, tag, buildID string) template.TagRecord {
	return template.TagRecord{Owner: owner, Name: name, Tag: tag, BuildID: buildID, UpdatedAt: base}
}

// storedTag is what a store gives back for tg: its time in UTC, truncated
// to the microsecond.
func storedTag(tg template.TagRecord) template.TagRecord {
	tg.UpdatedAt = tg.UpdatedAt.Truncate(time.Microsecond).UTC()
	return tg
}

// tagRefs names tags as owner/name:tag->build (public ones with a "+").
func tagRefs(ts []template.TagRecord) []string {
	out := []string{}
	for _, tg := range ts {
		ref := tg.Owner + "/" + tg.Name + ":" + tg.Tag + "->" + tg.BuildID
		if tg.Public {
			ref += "+"
		}
		out = append(out, ref)
	}
	return out
}

func testTagRoundTripAndReplace(t *testing.T, s store.Backend) {
	in := []template.TagRecord{
		{Owner: "key_a", Name: "app", Tag: template.DefaultTag, BuildID: "bld_1", Public: true,
			UpdatedAt: base.In(time.FixedZone("west", -7*3600))},
		{Owner: "", Name: "code-interpreter", Tag: "v2.1_rc-1", BuildID: "bld_builtin", UpdatedAt: base.Add(time.Hour)},
	}
	for _, tg := range in {
		putTag(t, s, tg)
		got, err := s.GetTag(ctx(t), tg.Owner, tg.Name, tg.Tag)
		if err != nil {
			t.Fatalf("GetTag(%s %s:%s): %v", tg.Owner, tg.Name, tg.Tag, err)
		}
		if diff := cmp.Diff(storedTag(tg), got); diff != "" {
			t.Errorf("round trip (-want +got):\n%s", diff)
		}
	}
	// Moving a tag to a new build replaces it: still one tag.
	moved := in[0]
	moved.BuildID, moved.Public, moved.UpdatedAt = "bld_2", false, base.Add(2*time.Hour)
	putTag(t, s, moved)
	got, err := s.GetTag(ctx(t), "key_a", "app", template.DefaultTag)
	if err != nil || got.BuildID != "bld_2" || got.Public || !got.UpdatedAt.Equal(moved.UpdatedAt.Truncate(time.Microsecond)) {
		t.Errorf("GetTag after moving = %+v, %v; want bld_2, private, updated %v", got, err, moved.UpdatedAt)
	}
	all, err := s.ListTags(ctx(t), "key_a", "app")
	if err != nil || len(all) != 1 {
		t.Errorf("ListTags after moving = %v, %v; want one tag", tagRefs(all), err)
	}
}

// testTagOwners: names are per owner. Two owners (and the built-ins, owner
// "") use the same name and tag for different builds, and neither sees,
// moves nor deletes the other's.
func testTagOwners(t *testing.T, s store.Backend) {
	putTag(t, s,
		tagRecord("key_a", "app", template.DefaultTag, "bld_a1"),
		tagRecord("key_a", "app", "v2", "bld_a2"),
		tagRecord("key_a", "web", template.DefaultTag, "bld_aw"),
		tagRecord("key_b", "app", template.DefaultTag, "bld_b1"),
		tagRecord("", "base", template.DefaultTag, "bld_base"),
	)
	gets := []struct {
		owner, name, tag string
		want             string // build id; "" for ErrNotFound
	}{
		{"key_a", "app", template.DefaultTag, "bld_a1"},
		{"key_a", "app", "v2", "bld_a2"},
		{"key_b", "app", template.DefaultTag, "bld_b1"},
		{"key_b", "app", "v2", ""},
		{"key_c", "app", template.DefaultTag, ""},
		{"", "app", template.DefaultTag, ""},
		{"key_a", "base", template.DefaultTag, ""},
		{"", "base", template.DefaultTag, "bld_base"},
		{"key_a", "APP", template.DefaultTag, ""},
	}
	for _, g := range gets {
		got, err := s.GetTag(ctx(t), g.owner, g.name, g.tag)
		switch {
		case g.want == "" && !errors.Is(err, errdefs.ErrNotFound):
			t.Errorf("GetTag(%q, %s:%s) = %+v, %v; want ErrNotFound", g.owner, g.name, g.tag, got, err)
		case g.want != "" && (err != nil || got.BuildID != g.want):
			t.Errorf("GetTag(%q, %s:%s) = %+v, %v; want build %s", g.owner, g.name, g.tag, got, err, g.want)
		}
	}
	lists := []struct {
		owner, name string
		want        []string
	}{
		{"key_a", "", []string{"key_a/app:default->bld_a1", "key_a/app:v2->bld_a2", "key_a/web:default->bld_aw"}},
		{"key_a", "app", []string{"key_a/app:default->bld_a1", "key_a/app:v2->bld_a2"}},
		{"key_b", "", []string{"key_b/app:default->bld_b1"}},
		{"key_c", "", []string{}},
		{"", "app", []string{"key_a/app:default->bld_a1", "key_b/app:default->bld_b1", "key_a/app:v2->bld_a2"}},
		{"", "", []string{"key_a/app:default->bld_a1", "key_b/app:default->bld_b1", "key_a/app:v2->bld_a2",
			"/base:default->bld_base", "key_a/web:default->bld_aw"}},
	}
	for _, l := range lists {
		got, err := s.ListTags(ctx(t), l.owner, l.name)
		if err != nil || !cmp.Equal(tagRefs(got), l.want) {
			t.Errorf("ListTags(%q, %q) = %v, %v; want %v", l.owner, l.name, tagRefs(got), err, l.want)
		}
	}

	// Deleting one owner's tag leaves the other's; deleting it again is
	// ErrNotFound.
	if err := s.DeleteTag(ctx(t), "key_a", "app", template.DefaultTag); err != nil {
		t.Fatalf("DeleteTag: %v", err)
	}
	for _, d := range []struct{ owner, name, tag string }{
		{"key_a", "app", template.DefaultTag}, // already gone
		{"key_c", "app", "v2"},                // someone else's name
		{"key_b", "app", "v2"},                // no such tag
	} {
		if err := s.DeleteTag(ctx(t), d.owner, d.name, d.tag); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("DeleteTag(%q, %s:%s) = %v, want ErrNotFound", d.owner, d.name, d.tag, err)
		}
	}
	got, err := s.ListTags(ctx(t), "", "app")
	if want := []string{"key_b/app:default->bld_b1", "key_a/app:v2->bld_a2"}; err != nil || !cmp.Equal(tagRefs(got), want) {
		t.Errorf("ListTags(app) after delete = %v, %v; want %v", tagRefs(got), err, want)
	}
}

// testTagPublic: SetPublic flips every tag of one owner's template and no
// other; PublicTags lists what any key may use.
func testTagPublic(t *testing.T, s store.Backend) {
	putTag(t, s,
		tagRecord("key_a", "app", template.DefaultTag, "bld_a1"),
		tagRecord("key_a", "app", "v2", "bld_a2"),
		tagRecord("key_a", "web", template.DefaultTag, "bld_aw"),
		tagRecord("key_b", "app", template.DefaultTag, "bld_b1"),
		tagRecord("key_b", "zed", "z", "bld_bz"),
	)
	steps := []struct {
		owner, name string
		public      bool
		err         error
		wantApp     []string // PublicTags("app") afterwards
		wantAll     []string // PublicTags("") afterwards
	}{
		{"key_a", "app", true, nil,
			[]string{"key_a/app:default->bld_a1+", "key_a/app:v2->bld_a2+"},
			[]string{"key_a/app:default->bld_a1+", "key_a/app:v2->bld_a2+"}},
		{"key_b", "zed", true, nil,
			[]string{"key_a/app:default->bld_a1+", "key_a/app:v2->bld_a2+"},
			[]string{"key_a/app:default->bld_a1+", "key_a/app:v2->bld_a2+", "key_b/zed:z->bld_bz+"}},
		{"key_b", "app", true, nil,
			[]string{"key_a/app:default->bld_a1+", "key_a/app:v2->bld_a2+", "key_b/app:default->bld_b1+"},
			[]string{"key_a/app:default->bld_a1+", "key_a/app:v2->bld_a2+", "key_b/app:default->bld_b1+", "key_b/zed:z->bld_bz+"}},
		{"key_a", "app", false, nil,
			[]string{"key_b/app:default->bld_b1+"},
			[]string{"key_b/app:default->bld_b1+", "key_b/zed:z->bld_bz+"}},
		// A template the owner does not have: nothing changes anywhere.
		{"key_c", "app", true, errdefs.ErrNotFound,
			[]string{"key_b/app:default->bld_b1+"},
			[]string{"key_b/app:default->bld_b1+", "key_b/zed:z->bld_bz+"}},
		{"key_a", "nope", true, errdefs.ErrNotFound,
			[]string{"key_b/app:default->bld_b1+"},
			[]string{"key_b/app:default->bld_b1+", "key_b/zed:z->bld_bz+"}},
		// Setting what is already set is no error.
		{"key_b", "app", true, nil,
			[]string{"key_b/app:default->bld_b1+"},
			[]string{"key_b/app:default->bld_b1+", "key_b/zed:z->bld_bz+"}},
	}
	for _, st := range steps {
		if err := s.SetPublic(ctx(t), st.owner, st.name, st.public); !errors.Is(err, st.err) || (st.err == nil) != (err == nil) {
			t.Errorf("SetPublic(%q, %q, %v) = %v, want %v", st.owner, st.name, st.public, err, st.err)
		}
		for _, q := range []struct {
			name string
			want []string
		}{{"app", st.wantApp}, {"", st.wantAll}} {
			got, err := s.PublicTags(ctx(t), q.name)
			if err != nil || !cmp.Equal(tagRefs(got), q.want) {
				t.Errorf("after SetPublic(%q, %q, %v): PublicTags(%q) = %v, %v; want %v",
					st.owner, st.name, st.public, q.name, tagRefs(got), err, q.want)
			}
		}
	}
	// The flag is on the tags themselves, as GetTag and ListTags see them.
	got, err := s.GetTag(ctx(t), "key_b", "app", template.DefaultTag)
	if err != nil || !got.Public {
		t.Errorf("GetTag(public tag) = %+v, %v; want Public", got, err)
	}
	web, err := s.ListTags(ctx(t), "key_a", "")
	if want := []string{"key_a/app:default->bld_a1", "key_a/app:v2->bld_a2", "key_a/web:default->bld_aw"}; err != nil ||
		!cmp.Equal(tagRefs(web), want) {
		t.Errorf("ListTags(key_a) = %v, %v; want %v", tagRefs(web), err, want)
	}
}
