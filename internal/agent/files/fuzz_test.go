package files

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-sh/kiln/api"
)

// FuzzResolve checks the agent's path resolution, which every file
// operation goes through: a path is either refused as invalid_argument or
// becomes a clean absolute path without NUL bytes; a relative path without
// ".." stays under the user's home; and stat of the result never panics
// and fails only with one of the client's error classes.
func FuzzResolve(f *testing.F) {
	for _, s := range []string{
		"", "a", "/", ".", "..", "a/../../b", "/etc/passwd", "//x//y/", "./.", "a\x00b",
		"../../../../../../etc/shadow", "/proc/self/root/etc", "~/x", "a/./b/../c", strings.Repeat("a/", 300),
		"\xff\xfe", "link/..", "/home/user/../../",
	} {
		f.Add("/home/user", s)
	}
	f.Add("", "rel")
	home := f.TempDir()
	os.Symlink("/", filepath.Join(home, "root-link"))
	os.Symlink("loop", filepath.Join(home, "loop"))
	svc := New(nil)
	f.Fuzz(func(t *testing.T, userHome, p string) {
		u := User{Name: "user", Home: userHome}
		got, err := Resolve(u, p)
		if err != nil {
			var e *api.Error
			if !errors.As(err, &e) || e.Code != api.CodeInvalidArgument {
				t.Fatalf("Resolve(%q, %q) error %v is not invalid_argument", userHome, p, err)
			}
			return
		}
		if !filepath.IsAbs(got) || filepath.Clean(got) != got || strings.ContainsRune(got, 0) {
			t.Fatalf("Resolve(%q, %q) = %q: not clean and absolute", userHome, p, got)
		}
		if !filepath.IsAbs(p) && filepath.IsAbs(userHome) && !hasDotDot(p) {
			if h := filepath.Clean(userHome); got != h && !strings.HasPrefix(got, strings.TrimSuffix(h, "/")+"/") {
				t.Fatalf("relative %q resolved outside home %q: %q", p, userHome, got)
			}
		}
		// Stat through the service, relative to a real home with
		// symlinks to / and to themselves.
		_, err = svc.Stat(context.Background(), User{Name: "root", Home: home}, p, Detail{})
		var e *api.Error
		if err != nil && !errors.As(err, &e) {
			t.Fatalf("stat %q: unclassified error %v", p, err)
		}
	})
}

func hasDotDot(p string) bool {
	for _, el := range strings.Split(p, "/") {
		if el == ".." {
			return true
		}
	}
	return false
}
