package sandbox

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-sh/kiln/internal/agentapi/wire"
)

func TestEnsureHosts(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "host-etc")
	if err := os.Mkdir(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	hostsFile := wire.Hosts("sb1")
	for _, tc := range []struct {
		name string
		make func(t *testing.T, root string)
		want string // etc/hosts afterwards; "" for none
	}{
		{"no hosts", func(t *testing.T, root string) { mkdir(t, root, "etc") }, hostsFile},
		{"template's own kept", func(t *testing.T, root string) {
			mkdir(t, root, "etc")
			write(t, filepath.Join(root, "etc/hosts"), "10.0.0.1 db\n")
		}, "10.0.0.1 db\n"},
		{"no etc", func(t *testing.T, root string) {}, ""},
		{"etc links out of the root", func(t *testing.T, root string) {
			if err := os.Symlink(outside, filepath.Join(root, "etc")); err != nil {
				t.Fatal(err)
			}
		}, ""},
		{"hosts links out of the root", func(t *testing.T, root string) {
			mkdir(t, root, "etc")
			if err := os.Symlink(filepath.Join(outside, "hosts"), filepath.Join(root, "etc/hosts")); err != nil {
				t.Fatal(err)
			}
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			tc.make(t, root)
			if err := ensureHosts(root, "sb1"); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(filepath.Join(root, "etc/hosts"))
			if tc.want == "" {
				if _, lerr := os.Lstat(filepath.Join(outside, "hosts")); lerr == nil {
					t.Fatal("wrote outside the root")
				}
				return
			}
			if err != nil || string(got) != tc.want {
				t.Fatalf("etc/hosts = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func mkdir(t *testing.T, root, name string) {
	t.Helper()
	if err := os.Mkdir(filepath.Join(root, name), 0o755); err != nil {
		t.Fatal(err)
	}
}

func write(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}
