package sudo

import (
	"fmt"
	"strings"
)

// invocation is what sudo's arguments ask for.
type invocation struct {
	user     string   // -u: a name or #uid; "" is root
	userSet  bool     // -u was given
	keepEnv  bool     // -E: the caller's environment
	keepVars []string // --preserve-env=A,B: these of the caller's variables
	setHome  bool     // -H: HOME is the target's (also with -E)
	login    bool     // -i: the target's login shell
	shell    bool     // -s: a shell ($SHELL or the target's)
	noop     bool     // -v, -k, -K without a command: nothing to do
	assign   []string // VAR=value before the command
	cmd      []string
}

// usage names what this sudo supports, for its errors.
const usage = "Kiln's sudo supports -n, -E, -H, -u USER, -i, -s, --preserve-env=LIST, -v, -k and --; " +
	"usage: sudo [-nEH] [-u USER] [-i|-s] [VAR=value...] [--] command [args...]"

// parseArgs reads sudo's arguments (without argv[0]) the way sudo does:
// options up to the first non-option or "--", then VAR=value
// assignments, then the command.
func parseArgs(args []string) (invocation, error) {
	var inv invocation
	i := 0
	for ; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			i++
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			break
		}
		if strings.HasPrefix(a, "--") {
			name, val, hasVal := strings.Cut(a[2:], "=")
			if name == "user" && !hasVal {
				if i+1 >= len(args) {
					return inv, fmt.Errorf("option --user requires an argument; %s", usage)
				}
				i++
				val, hasVal = args[i], true
			}
			if err := inv.long(name, val, hasVal); err != nil {
				return inv, err
			}
			continue
		}
		for j := 1; j < len(a); j++ {
			c := a[j]
			if c != 'u' {
				if err := inv.short(c); err != nil {
					return inv, err
				}
				continue
			}
			inv.userSet = true
			switch {
			case j+1 < len(a):
				inv.user = a[j+1:]
			case i+1 < len(args):
				i++
				inv.user = args[i]
			default:
				return inv, fmt.Errorf("option -u requires an argument; %s", usage)
			}
			break
		}
	}
	for ; i < len(args) && isAssignment(args[i]); i++ {
		inv.assign = append(inv.assign, args[i])
	}
	inv.cmd = args[i:]
	switch {
	case inv.login && inv.shell:
		return inv, fmt.Errorf("you may not specify both the -i and -s options")
	case len(inv.cmd) == 0 && !inv.login && !inv.shell && !inv.noop:
		return inv, fmt.Errorf("no command given; %s", usage)
	case strings.ContainsAny(inv.user, ":\x00") || (inv.user == "" && inv.userSet):
		return inv, fmt.Errorf("invalid user %q", inv.user)
	}
	return inv, nil
}

// short applies a one-letter option other than -u.
func (inv *invocation) short(c byte) error {
	switch c {
	case 'n':
		// Never prompts: there is no password.
	case 'E':
		inv.keepEnv = true
	case 'H':
		inv.setHome = true
	case 'i':
		inv.login = true
	case 's':
		inv.shell = true
	case 'v', 'k', 'K':
		inv.noop = true
	default:
		return fmt.Errorf("unknown option -%c; %s", c, usage)
	}
	return nil
}

// long applies a --name[=value] option.
func (inv *invocation) long(name, val string, hasVal bool) error {
	switch {
	case name == "user":
		inv.user, inv.userSet = val, true
		return nil
	case name == "preserve-env" && hasVal:
		inv.keepVars = append(inv.keepVars, strings.Split(val, ",")...)
		return nil
	case hasVal:
		return fmt.Errorf("unknown option --%s=...; %s", name, usage)
	}
	short := map[string]byte{"non-interactive": 'n', "preserve-env": 'E', "set-home": 'H',
		"login": 'i', "shell": 's', "validate": 'v', "reset-timestamp": 'k', "remove-timestamp": 'K'}
	c, ok := short[name]
	if !ok {
		return fmt.Errorf("unknown option --%s; %s", name, usage)
	}
	return inv.short(c)
}

// isAssignment reports whether a is VAR=value with a valid name.
func isAssignment(a string) bool {
	name, _, ok := strings.Cut(a, "=")
	return ok && validName(name)
}

// validName reports whether s can name an environment variable.
func validName(s string) bool {
	if s == "" || (s[0] >= '0' && s[0] <= '9') {
		return false
	}
	for _, c := range []byte(s) {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// shellCommand joins a command for a shell's -c as sudo -s and -i do:
// every character but letters, digits, '_', '-' and '$' escaped with a
// backslash, arguments separated by spaces.
func shellCommand(cmd []string) string {
	var b strings.Builder
	for i, a := range cmd {
		if i > 0 {
			b.WriteByte(' ')
		}
		for _, c := range []byte(a) {
			if !(c == '_' || c == '-' || c == '$' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
				b.WriteByte('\\')
			}
			b.WriteByte(c)
		}
	}
	return b.String()
}
