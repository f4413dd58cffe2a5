package sudo

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kiln-sh/kiln/internal/agent/process"
)

func TestParseArgs(t *testing.T) {
	for _, c := range []struct {
		args []string
		want invocation
		err  string
	}{
		{args: []string{"id", "-u"}, want: invocation{cmd: []string{"id", "-u"}}},
		{args: []string{"-n", "-E", "id"}, want: invocation{keepEnv: true, cmd: []string{"id"}}},
		{args: []string{"-nEH", "id"}, want: invocation{keepEnv: true, setHome: true, cmd: []string{"id"}}},
		{args: []string{"-u", "user", "id"}, want: invocation{user: "user", userSet: true, cmd: []string{"id"}}},
		{args: []string{"-uuser", "id"}, want: invocation{user: "user", userSet: true, cmd: []string{"id"}}},
		{args: []string{"-nu", "#1000", "id"}, want: invocation{user: "#1000", userSet: true, cmd: []string{"id"}}},
		{args: []string{"--user=user", "--", "-x"}, want: invocation{user: "user", userSet: true, cmd: []string{"-x"}}},
		{args: []string{"--user", "user", "id"}, want: invocation{user: "user", userSet: true, cmd: []string{"id"}}},
		{args: []string{"--preserve-env=A,B", "env"}, want: invocation{keepVars: []string{"A", "B"}, cmd: []string{"env"}}},
		{args: []string{"-i"}, want: invocation{login: true, cmd: []string{}}},
		{args: []string{"-s", "echo", "hi"}, want: invocation{shell: true, cmd: []string{"echo", "hi"}}},
		{args: []string{"-v"}, want: invocation{noop: true, cmd: []string{}}},
		{args: []string{"A=1", "B_2=x=y", "env", "C=3"}, want: invocation{assign: []string{"A=1", "B_2=x=y"}, cmd: []string{"env", "C=3"}}},
		{args: []string{"--", "-u"}, want: invocation{cmd: []string{"-u"}}},
		{args: []string{"1A=x"}, want: invocation{cmd: []string{"1A=x"}}},
		{args: []string{}, err: "no command given"},
		{args: []string{"-n"}, err: "no command given"},
		{args: []string{"-Z", "id"}, err: "unknown option -Z"},
		{args: []string{"--frob", "id"}, err: "unknown option --frob"},
		{args: []string{"--login=x"}, err: "unknown option --login=..."},
		{args: []string{"-u"}, err: "option -u requires an argument"},
		{args: []string{"--user"}, err: "option --user requires an argument"},
		{args: []string{"-u", "", "id"}, err: "invalid user"},
		{args: []string{"-u", "user:root", "id"}, err: "invalid user"},
		{args: []string{"-i", "-s"}, err: "both the -i and -s"},
	} {
		got, err := parseArgs(c.args)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("parseArgs(%q): err %v, want %q", c.args, err, c.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("parseArgs(%q) = %+v, %v; want %+v", c.args, got, err, c.want)
		}
	}
}

func TestShellCommand(t *testing.T) {
	got := shellCommand([]string{"echo", "$HOME", "a b", "it's;x"})
	if want := `echo $HOME a\ b it\'s\;x`; got != want {
		t.Errorf("shellCommand = %q, want %q", got, want)
	}
}

func TestCommandEnv(t *testing.T) {
	caller := process.User{Name: "user", UID: 1000, GID: 1000, Home: "/home/user", Shell: "/bin/bash"}
	root := process.User{Name: "root", Home: "/root", Shell: "/bin/bash"}
	callerEnv := []string{"PATH=/home/user/bin:/usr/bin", "HOME=/home/user", "TERM=xterm", "LC_ALL=C", "SECRET=x", "A=1", "bad name=1"}
	for _, c := range []struct {
		name string
		inv  invocation
		want map[string]string // "" value: unset
	}{
		{"reset", invocation{cmd: []string{"id"}}, map[string]string{
			"PATH": "/.kiln/bin:" + process.DefaultPath, "HOME": "/root", "TERM": "xterm", "LC_ALL": "C", "SECRET": "",
			"USER": "root", "LOGNAME": "root", "SHELL": "/bin/bash", "SUDO_USER": "user", "SUDO_UID": "1000", "SUDO_GID": "1000",
			"SUDO_COMMAND": "id"}},
		{"-E", invocation{keepEnv: true, cmd: []string{"id"}}, map[string]string{
			"PATH": "/.kiln/bin:" + process.DefaultPath, "HOME": "/home/user", "SECRET": "x", "USER": "root"}},
		{"-EH", invocation{keepEnv: true, setHome: true, cmd: []string{"id"}}, map[string]string{"HOME": "/root", "SECRET": "x"}},
		{"--preserve-env=A", invocation{keepVars: []string{"A"}, cmd: []string{"id"}}, map[string]string{"A": "1", "SECRET": ""}},
		{"assignments", invocation{assign: []string{"SECRET=y", "PATH=/x"}, cmd: []string{"id"}}, map[string]string{"SECRET": "y", "PATH": "/x"}},
		{"-i ignores -E", invocation{login: true, keepEnv: true}, map[string]string{"SECRET": "", "HOME": "/root"}},
	} {
		env := commandEnv(c.inv, callerEnv, caller, root, "/.kiln/bin")
		for k, v := range c.want {
			if got := getenv(env, k); got != v {
				t.Errorf("%s: %s=%q, want %q (env %q)", c.name, k, got, v, env)
			}
		}
		for _, kv := range env {
			if strings.HasPrefix(kv, "bad name") {
				t.Errorf("%s: kept an invalid variable %q", c.name, kv)
			}
		}
	}
}

func TestLink(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "usr", "local", "bin")
	if made, err := Link(dir, "/.kiln/bin/sudo"); !made || err != nil {
		t.Fatalf("Link: %v, %v", made, err)
	}
	if target, err := os.Readlink(filepath.Join(dir, "sudo")); err != nil || target != "/.kiln/bin/sudo" {
		t.Errorf("link: %q, %v", target, err)
	}
	// A template's own sudo there (or the link of an earlier start) stays.
	if made, err := Link(dir, "/elsewhere"); made || err != nil {
		t.Errorf("Link again: %v, %v", made, err)
	}
	if target, _ := os.Readlink(filepath.Join(dir, "sudo")); target != "/.kiln/bin/sudo" {
		t.Errorf("link replaced: %q", target)
	}
}
