package agent

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/kiln-sh/kiln/internal/agentapi/wire"
)

func TestRenameHosts(t *testing.T) {
	name, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, content, want string
	}{
		{"another sandbox's", wire.Hosts("a1b2c3"), wire.Hosts(name)},
		{"already this one's", wire.Hosts(name), wire.Hosts(name)},
		{"the template's", "10.0.0.1 db\n", "10.0.0.1 db\n"},
		{"changed by the user", wire.Hosts("a1b2c3") + "10.0.0.1 db\n", wire.Hosts("a1b2c3") + "10.0.0.1 db\n"},
		{"no name", wire.Hosts(""), wire.Hosts("")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "hosts")
			if err := os.WriteFile(p, []byte(tc.content), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := renameHosts(p); err != nil {
				t.Fatal(err)
			}
			if got, _ := os.ReadFile(p); string(got) != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
	t.Run("not a regular file", func(t *testing.T) {
		dir := t.TempDir()
		fifo := filepath.Join(dir, "fifo")
		if err := syscall.Mkfifo(fifo, 0o644); err != nil {
			t.Fatal(err)
		}
		link := filepath.Join(dir, "link")
		target := filepath.Join(dir, "target")
		if err := os.WriteFile(target, []byte(wire.Hosts("a1b2c3")), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{fifo, link, filepath.Join(dir, "none"), ""} {
			if err := renameHosts(p); err != nil {
				t.Errorf("%s: %v", p, err)
			}
		}
		if got, _ := os.ReadFile(target); string(got) != wire.Hosts("a1b2c3") {
			t.Errorf("followed the link: %q", got)
		}
	})
}
