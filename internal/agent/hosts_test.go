package agent

import (
	"os"
	"path/filepath"
	"testing"
)

func TestEnsureHosts(t *testing.T) {
	tests := []struct {
		name     string
		existing string // "" : no file
		hostname string
		want     string
	}{
		{"written", "", "sbx1", "127.0.0.1\tlocalhost\n::1\tip6-localhost ip6-loopback\n127.0.1.1\tsbx1\n"},
		{"no hostname", "", "", "127.0.0.1\tlocalhost\n::1\tip6-localhost ip6-loopback\n"},
		{"hostname localhost", "", "localhost", "127.0.0.1\tlocalhost\n::1\tip6-localhost ip6-loopback\n"},
		{"hostname that would add names", "", "a b\n10.0.0.1 evil", "127.0.0.1\tlocalhost\n::1\tip6-localhost ip6-loopback\n"},
		{"the template's own is kept", "10.1.2.3 db\n", "sbx1", "10.1.2.3 db\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "etc", "hosts")
			if tt.existing != "" {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(tt.existing), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if err := ensureHosts(path, tt.hostname); err != nil {
				t.Fatal(err)
			}
			if err := ensureHosts(path, "other"); err != nil { // idempotent
				t.Fatal(err)
			}
			b, err := os.ReadFile(path)
			if err != nil || string(b) != tt.want {
				t.Errorf("hosts = %q, %v; want %q", b, err, tt.want)
			}
		})
	}
}
