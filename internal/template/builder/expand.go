package builder

import (
	"errors"
	"strings"
)

// ENV values are double-quoted shell words (the Dockerfile front end
// escapes $, `, " and \ and leaves references to the base's variables as
// ${NAME}). The engine evaluates them on the host, against the build's
// environment so far, rather than with printf in a build sandbox: an ENV
// step then costs no sandbox, and the result is what Docker gives, whose
// ENV expansion also sees only the image's and the Dockerfile's variables
// (PATH defaults to the usual one when the base sets none). Command
// substitution and ${NAME...} operators are refused.

// defaultPath is PATH when the base's environment has none (oci.DefaultPath).
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

var errSubst = errors.New("command substitution and ${...} operators are not supported in ENV values")

// expandWord evaluates s as the inside of a double-quoted shell word.
func expandWord(s string, env map[string]string) (string, error) {
	get := func(name string) string {
		if v, ok := env[name]; ok {
			return v
		}
		if name == "PATH" {
			return defaultPath
		}
		return ""
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch c {
		case '\\':
			if i+1 < len(s) && strings.IndexByte("$`\"\\\n", s[i+1]) >= 0 {
				i++
				if s[i] != '\n' { // a backslash-newline is removed
					b.WriteByte(s[i])
				}
				continue
			}
			b.WriteByte(c)
		case '`':
			return "", errSubst
		case '$':
			rest := s[i+1:]
			switch {
			case strings.HasPrefix(rest, "{"):
				end := strings.IndexByte(rest, '}')
				if end < 0 || !envNameRE.MatchString(rest[1:end]) {
					return "", errSubst
				}
				b.WriteString(get(rest[1:end]))
				i += end + 1
			case strings.HasPrefix(rest, "("):
				return "", errSubst
			default:
				n := 0
				for n < len(rest) && (rest[n] == '_' || rest[n] >= 'a' && rest[n] <= 'z' ||
					rest[n] >= 'A' && rest[n] <= 'Z' || n > 0 && rest[n] >= '0' && rest[n] <= '9') {
					n++
				}
				if n == 0 {
					b.WriteByte(c) // a lone $ is literal
					continue
				}
				b.WriteString(get(rest[:n]))
				i += n
			}
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), nil
}
