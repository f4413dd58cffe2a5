package dockerfile

import (
	"regexp"
	"sort"
	"strings"
)

// Variables are expanded at compile time as Docker does, from the ARG and
// ENV values the Dockerfile sets. A variable the Dockerfile does not set
// may come from the base's environment (PATH, HOME), which the compiler
// cannot see. In ENV values it is kept as a reference for the engine to
// evaluate (see shellWord); elsewhere it expands to empty, with a warning.
//
// Values are held with such references marked by unknownMark around the
// variable's name; the Dockerfile itself may not contain the mark.
const unknownMark = "\x00"

// scope is the variables in effect at one point of the Dockerfile.
type scope struct {
	args map[string]*string // ARGs declared in the stage (nil: no value)
	env  map[string]string  // ENV set by the Dockerfile
}

func newScope() *scope {
	return &scope{args: map[string]*string{}, env: map[string]string{}}
}

// lookup is the shell.EnvGetter expansions use: ENV wins over ARG, as in
// Docker. keep marks variables the Dockerfile does not set (see
// unknownMark); otherwise they are unset and collected in missing.
type lookup struct {
	s       *scope
	keep    bool
	missing map[string]bool
}

func (l *lookup) Get(name string) (string, bool) {
	if v, ok := l.s.env[name]; ok {
		return v, true
	}
	if v, ok := l.s.args[name]; ok && v != nil {
		return *v, true
	}
	if l.keep {
		return unknownMark + name + unknownMark, true
	}
	if l.missing == nil {
		l.missing = map[string]bool{}
	}
	l.missing[name] = true
	return "", false
}

func (l *lookup) Keys() []string {
	keys := make([]string, 0, len(l.s.env)+len(l.s.args))
	for k := range l.s.env {
		keys = append(keys, k)
	}
	for k, v := range l.s.args {
		if _, ok := l.s.env[k]; !ok && v != nil {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys
}

// literal returns v without references to unknown variables (Docker
// expands an unset variable to empty) and their names.
func literal(v string) (string, []string) {
	if !strings.Contains(v, unknownMark) {
		return v, nil
	}
	parts := strings.Split(v, unknownMark)
	var b strings.Builder
	var names []string
	for i, p := range parts {
		if i%2 == 0 {
			b.WriteString(p)
		} else {
			names = append(names, p)
		}
	}
	return b.String(), names
}

// shellWord renders v for use inside double quotes in a POSIX shell: the
// characters special there are escaped, and references to unknown
// variables become ${NAME}, so evaluating the word in the build sandbox
// (printf '%s' "<word>") gives Docker's value.
func shellWord(v string) string {
	var b strings.Builder
	parts := strings.Split(v, unknownMark)
	for i, p := range parts {
		if i%2 == 1 {
			b.WriteString("${" + p + "}")
			continue
		}
		for _, r := range p {
			switch r {
			case '$', '`', '"', '\\':
				b.WriteByte('\\')
			}
			b.WriteRune(r)
		}
	}
	return b.String()
}

// safeWord matches words a POSIX shell takes literally without quotes.
var safeWord = regexp.MustCompile(`^[A-Za-z0-9_@%+:,./-]+$`)

// reserved are the shell's reserved words, which are keywords (not
// commands) when unquoted in command position.
var reserved = map[string]bool{
	"!": true, "{": true, "}": true, "case": true, "do": true, "done": true,
	"elif": true, "else": true, "esac": true, "fi": true, "for": true,
	"if": true, "in": true, "then": true, "until": true, "while": true,
	"function": true, "select": true, "time": true, "[[": true, "]]": true,
}

// quoteArgs renders an exec-form argument list as one shell command line
// that runs exactly those arguments: each word is single-quoted unless the
// shell would take it literally anyway.
func quoteArgs(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		if safeWord.MatchString(a) && (i > 0 || !reserved[a]) {
			q[i] = a
			continue
		}
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}

// shellName matches the names a POSIX shell can export.
var shellName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
