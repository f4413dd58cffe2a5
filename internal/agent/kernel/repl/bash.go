package repl

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"syscall"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agent/kernel"
)

// NewBash starts a persistent bash: the working directory, variables,
// functions and aliases persist from one cell to the next.
//
// bash runs interactive (-i) on pipes, with line editing, history and
// prompts off, because only an interactive shell aborts the whole command
// line, builtin loops included, on SIGINT and then carries on. Each cell
// is one command line:
//
//	PROMPT_COMMAND=__kiln_prompt; __kiln_id=N; <env>; { eval '<code>'
//	} </dev/null 3>&-
//
// and the shell runs PROMPT_COMMAND when the line ends, even by SIGINT; it
// prints the markers "\x02kiln-TOKEN-N:STATUS\x03" on stdout and
// "\x02kiln-TOKEN-N\x03" on stderr. An EXIT trap prints
// "\x02kiln-TOKEN-exit:STATUS\x03", so a cell's exit is reported with its
// status. fd 3 is a pipe only the shell holds: its EOF means the shell
// ended. Cells read stdin from /dev/null.
func NewBash(ctx context.Context, o kernel.Options) (kernel.Kernel, error) {
	k := &replKernel{lang: "bash", opts: o}
	k.start = func() (*session, error) {
		return startSession(k.opts, spec{
			argv:  []string{"bash", "--noprofile", "--norc", "-i"},
			reqFD: 0,
			ctlFD: 3,
			token: newToken(),
		})
	}
	k.initReq = bashInit
	k.request = bashRequest
	k.result = bashResult
	k.interrupt = bashInterrupt
	if err := k.Restart(ctx); err != nil {
		return nil, err
	}
	return k, nil
}

func bashInit(s *session) []byte {
	m := `\002kiln-` + s.token + `-`
	return []byte(`set +o emacs +o vi +o history +H; PS1=; PS2=; PS4='+ '; unset HISTFILE MAIL MAILPATH PROMPT_COMMAND; ` +
		`__kiln_ret() { return "$1"; }; ` +
		`__kiln_prompt() { local r=$?; eval "$__kiln_restore"; __kiln_restore=; ` +
		`printf '` + m + `%s:%s\003' "$__kiln_id" "$r"; printf '` + m + `%s\003' "$__kiln_id" >&2; __kiln_ret "$r"; }; ` +
		`trap 'printf "` + m + `exit:%s\003" "$?"' EXIT; ` +
		"__kiln_id=0; __kiln_restore=; PROMPT_COMMAND=__kiln_prompt\n")
}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// quote quotes s for bash as one word.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func bashRequest(_ *session, id int, code string, env map[string]string) ([]byte, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "PROMPT_COMMAND=__kiln_prompt; __kiln_id=%d; ", id)
	keys := make([]string, 0, len(env))
	for k := range env {
		if !envName.MatchString(k) {
			return nil, fmt.Errorf("invalid environment variable name %q", k)
		}
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		// Save the old value (or unset-ness), export the new one.
		fmt.Fprintf(&b, `if [ "${%s+x}" ]; then __kiln_old_%s=$%s; __kiln_restore+='%s=$__kiln_old_%s; '; else __kiln_restore+='unset %s; '; fi; export %s=%s; `,
			k, k, k, k, k, k, k, quote(env[k]))
	}
	fmt.Fprintf(&b, "{ eval %s\n} </dev/null 3>&-\n", quote(code))
	return []byte(b.String()), nil
}

// bashResult reports a non-zero status of the cell's last command.
func bashResult(r turnResult) []api.Event {
	_, status, _ := strings.Cut(r.payload, ":")
	if status == "" || status == "0" {
		return nil
	}
	ee := &api.ExecutionError{Name: "ExitError", Value: "exit status " + status}
	if status == "130" {
		ee.Name, ee.Value = "Interrupted", "execution interrupted (exit status 130)"
	}
	return []api.Event{{Type: api.EventExecutionError, ExecutionError: ee}}
}

// bashInterrupt: SIGINT to the shell's process group (the shell aborts the
// command line, children die), again, then kill (state is lost).
func bashInterrupt(s *session, step int, _ []byte) {
	switch step {
	case 0, 1:
		s.signal(syscall.SIGINT, true)
	default:
		s.signal(syscall.SIGKILL, true)
	}
}
