package agent

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestLookupAccount resolves the users template builds name in USER: the
// two wire names, any /etc/passwd name, numeric uids with or without an
// entry, and ":group" by name or number.
func TestLookupAccount(t *testing.T) {
	dir := t.TempDir()
	pw, gr := filepath.Join(dir, "passwd"), filepath.Join(dir, "group")
	writeFile(t, pw, "root:x:0:0:root:/root:/bin/bash\n"+
		"user:x:1000:1000::/home/user:/bin/bash\n"+
		"postgres:x:105:110::/var/lib/postgresql:/bin/sh\n"+
		"broken:x:nope:1::/:/bin/sh\n")
	writeFile(t, gr, "root:x:0:\nuser:x:1000:\npostgres:x:110:\nssl-cert:x:111:postgres\nstaff:x:50:user\n")
	oldPw, oldGr := passwdFile, groupFile
	passwdFile, groupFile = pw, gr
	t.Cleanup(func() { passwdFile, groupFile = oldPw, oldGr })

	for _, tc := range []struct {
		in       string
		name     string
		uid, gid uint32
		home     string
		groups   []uint32
		bad      bool
	}{
		{in: "", name: "user", uid: 1000, gid: 1000, home: "/home/user", groups: []uint32{1000, 50}},
		{in: "root", name: "root", uid: 0, gid: 0, home: "/root", groups: []uint32{0}},
		{in: "postgres", name: "postgres", uid: 105, gid: 110, home: "/var/lib/postgresql", groups: []uint32{110, 111}},
		{in: "105", name: "postgres", uid: 105, gid: 110, home: "/var/lib/postgresql", groups: []uint32{110, 111}},
		{in: "4242", name: "4242", uid: 4242, gid: 4242, home: "/", groups: []uint32{4242}},
		{in: "4242:50", name: "4242", uid: 4242, gid: 50, home: "/", groups: []uint32{50}},
		{in: "postgres:staff", name: "postgres", uid: 105, gid: 50, home: "/var/lib/postgresql", groups: []uint32{50, 111}},
		{in: "user:ssl-cert", name: "user", uid: 1000, gid: 111, home: "/home/user", groups: []uint32{111, 50}},
		{in: "nobody", bad: true},
		{in: "broken", bad: true},
		{in: "postgres:nogroup", bad: true},
		{in: "-1", bad: true},
	} {
		a, err := lookupAccount(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("lookupAccount(%q) = %+v, want an error", tc.in, a)
			}
			continue
		}
		if err != nil {
			t.Errorf("lookupAccount(%q): %v", tc.in, err)
			continue
		}
		if a.name != tc.name || a.uid != tc.uid || a.gid != tc.gid || a.home != tc.home || !slices.Equal(a.groups, tc.groups) {
			t.Errorf("lookupAccount(%q) = %+v, want name %s uid %d gid %d home %s groups %v",
				tc.in, a, tc.name, tc.uid, tc.gid, tc.home, tc.groups)
		}
	}
}

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}
