package layer

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// maxIDFile bounds how much of /etc/passwd or /etc/group is read.
const maxIDFile = 4 << 20

// owner resolves a COPY owner against the view's /etc/passwd and
// /etc/group (the topmost layer holding each wins, as in the sandbox):
// "user" or "uid" (the group is the user's primary group, or the uid
// itself for a uid not in /etc/passwd, as Docker does), "user:group",
// with names or numbers on either side. An unknown name is
// ErrInvalidArgument.
func (v *view) owner(spec string) (uid, gid int, err error) {
	u, g, hasGroup := strings.Cut(spec, ":")
	if u == "" || (hasGroup && g == "") {
		return 0, 0, fmt.Errorf("owner %q: want user[:group]: %w", errdefs.Clip(spec), errdefs.ErrInvalidArgument)
	}
	passwd, err := v.idFile("/etc/passwd")
	if err != nil {
		return 0, 0, err
	}
	primary := -1
	if n, ok := parseID(u); ok {
		uid = n
		if e := findEntry(passwd, 2, u); e != nil {
			primary, _ = parseID(e[3])
		}
	} else if e := findEntry(passwd, 0, u); e != nil {
		var ok1, ok2 bool
		uid, ok1 = parseID(e[2])
		primary, ok2 = parseID(e[3])
		if !ok1 || !ok2 {
			return 0, 0, fmt.Errorf("user %q: bad /etc/passwd entry: %w", errdefs.Clip(u), errdefs.ErrInvalidArgument)
		}
	} else {
		return 0, 0, fmt.Errorf("unknown user %q (not in the template's /etc/passwd): %w", errdefs.Clip(u), errdefs.ErrInvalidArgument)
	}
	switch {
	case !hasGroup && primary >= 0:
		gid = primary
	case !hasGroup:
		gid = uid
	default:
		if n, ok := parseID(g); ok {
			gid = n
			break
		}
		group, err := v.idFile("/etc/group")
		if err != nil {
			return 0, 0, err
		}
		e := findEntry(group, 0, g)
		if e == nil {
			return 0, 0, fmt.Errorf("unknown group %q (not in the template's /etc/group): %w", errdefs.Clip(g), errdefs.ErrInvalidArgument)
		}
		var ok bool
		if gid, ok = parseID(e[2]); !ok {
			return 0, 0, fmt.Errorf("group %q: bad /etc/group entry: %w", errdefs.Clip(g), errdefs.ErrInvalidArgument)
		}
	}
	return uid, gid, nil
}

// idFile reads an /etc/passwd-style file of the view into its lines'
// fields; a missing file is empty.
func (v *view) idFile(p string) ([][]string, error) {
	b, err := v.readFile(p, maxIDFile)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", p, err)
	}
	var out [][]string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Split(line, ":"); len(f) >= 4 && !strings.HasPrefix(line, "#") {
			out = append(out, f)
		}
	}
	return out, nil
}

func findEntry(lines [][]string, field int, val string) []string {
	for _, f := range lines {
		if f[field] == val {
			return f
		}
	}
	return nil
}

// parseID parses a uid or gid (0 to 2^32-2).
func parseID(s string) (int, bool) {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n == 1<<32-1 {
		return 0, false
	}
	return int(n), true
}
