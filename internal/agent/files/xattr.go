package files

import (
	"errors"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kiln-sh/kiln/api"
)

const (
	// maxXattrs bounds the attributes read or written at once.
	maxXattrs = 64
	// maxXattrBytes bounds the names and values read or written at once.
	maxXattrBytes = 64 << 10
)

// checkXattrPrefix allows only the user namespace, so callers cannot touch
// security or trusted attributes.
func checkXattrPrefix(prefix string) error {
	if !strings.HasPrefix(prefix, "user.") || strings.ContainsRune(prefix, 0) {
		return apiErrorf(api.CodeInvalidArgument, "extended attribute prefix %q must start with \"user.\"", prefix)
	}
	return nil
}

// ignorableXattrError: a file system without extended attributes, a path
// that vanished or an unreadable one simply has none to report.
func ignorableXattrError(err error) bool {
	return errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EACCES)
}

// readXattrs returns the extended attributes of p (a symlink itself,
// not its target) whose names start with prefix, keyed by the rest of
// their names.
func readXattrs(p, prefix string) (map[string]string, error) {
	names, err := listXattrs(func(b []byte) (int, error) { return unix.Llistxattr(p, b) })
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	total := 0
	for _, name := range names {
		key, ok := strings.CutPrefix(name, prefix)
		if !ok || key == "" {
			continue
		}
		val, err := xattrValue(func(b []byte) (int, error) { return unix.Lgetxattr(p, name, b) })
		if errors.Is(err, unix.ENODATA) {
			continue // removed meanwhile
		}
		if err != nil {
			return nil, err
		}
		if total += len(key) + len(val); total > maxXattrBytes || len(out) >= maxXattrs {
			return nil, apiErrorf(api.CodeResourceExhausted, "%s has too many extended attributes under %s", p, prefix)
		}
		out[key] = string(val)
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// setXattrs replaces f's extended attributes under prefix with values.
func setXattrs(f *os.File, prefix string, values map[string]string) error {
	fd := int(f.Fd())
	names, err := listXattrs(func(b []byte) (int, error) { return unix.Flistxattr(fd, b) })
	if err != nil {
		return err
	}
	for _, name := range names {
		if strings.HasPrefix(name, prefix) {
			if err := unix.Fremovexattr(fd, name); err != nil && !errors.Is(err, unix.ENODATA) {
				return err
			}
		}
	}
	for k, v := range values {
		if err := unix.Fsetxattr(fd, prefix+k, []byte(v), 0); err != nil {
			return err
		}
	}
	return nil
}

// checkXattrs validates attributes to write.
func checkXattrs(prefix string, values map[string]string) error {
	if err := checkXattrPrefix(prefix); err != nil {
		return err
	}
	total := 0
	for k, v := range values {
		total += len(k) + len(v)
		if k == "" || strings.ContainsRune(k, 0) {
			return apiErrorf(api.CodeInvalidArgument, "invalid extended attribute name %q", k)
		}
	}
	if total > maxXattrBytes || len(values) > maxXattrs {
		return apiErrorf(api.CodeInvalidArgument, "too many extended attributes: at most %d, %d bytes", maxXattrs, maxXattrBytes)
	}
	return nil
}

// listXattrs returns the attribute names list reports, growing its
// buffer while the list grows.
func listXattrs(list func([]byte) (int, error)) ([]string, error) {
	b, err := xattrValue(list)
	if err != nil || len(b) == 0 {
		return nil, err
	}
	return strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00"), nil
}

// xattrValue calls get with a buffer large enough for its answer.
func xattrValue(get func([]byte) (int, error)) ([]byte, error) {
	for range 4 {
		n, err := get(nil)
		if err != nil {
			return nil, err
		}
		if n > maxXattrBytes {
			return nil, apiErrorf(api.CodeResourceExhausted, "extended attributes larger than %d bytes", maxXattrBytes)
		}
		b := make([]byte, n)
		n, err = get(b)
		if errors.Is(err, unix.ERANGE) {
			continue // it grew meanwhile
		}
		if err != nil {
			return nil, err
		}
		return b[:n], nil
	}
	return nil, apiErrorf(api.CodeUnavailable, "extended attributes keep changing")
}
