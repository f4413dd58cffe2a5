package builder

import (
	"errors"
	"strings"
	"testing"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/errdefs"
)

const hash64 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// Bad recipes are refused before anything is recorded, naming the step.
func TestValidate(t *testing.T) {
	base := api.TemplateBase{Template: "base"}
	step := func(typ string, args ...string) api.TemplateStep { return api.TemplateStep{Type: typ, Args: args} }
	for _, tc := range []struct {
		name string
		spec api.TemplateSpec
		msg  string // "" when valid
	}{
		{"good", api.TemplateSpec{From: base, Steps: []api.TemplateStep{
			step("RUN", "echo hi"), step("RUN", "id", "postgres:staff"), step("ENV", "A", "1", "B", "${A}x"),
			step("WORKDIR", "rel/dir"), step("USER", "1000:1000"),
			{Type: "COPY", Args: []string{"data", "./", "user", "0644"}, FilesHash: hash64},
			{Type: "ADD", Args: []string{"x.tar", "/opt/"}, FilesHash: hash64},
		}, StartCmd: "python3 -m http.server", ReadyCmd: "true"}, ""},
		{"image", api.TemplateSpec{From: api.TemplateBase{Image: "127.0.0.1:5000/app:v1", Registry: &api.RegistryAuth{Username: "u", Password: "p"}}}, ""},
		{"no base", api.TemplateSpec{}, "exactly one of"},
		{"debian", api.TemplateSpec{From: api.TemplateBase{Debian: &api.DebianBase{Suite: "bookworm", Variant: "minbase", Packages: []string{"g++", "python3.11"}}}}, ""},
		{"debian and template", api.TemplateSpec{From: api.TemplateBase{Template: "base", Debian: &api.DebianBase{Suite: "bookworm", Variant: "minbase"}}}, "exactly one of"},
		{"debian on a template", api.TemplateSpec{From: api.TemplateBase{Debian: &api.DebianBase{Template: "base", Packages: []string{"r-base-core"}}}}, ""},
		{"debian on a template with suite", api.TemplateSpec{From: api.TemplateBase{Debian: &api.DebianBase{Template: "base", Suite: "bookworm", Packages: []string{"x"}}}}, "with a template"},
		{"debian on a template, nothing", api.TemplateSpec{From: api.TemplateBase{Debian: &api.DebianBase{Template: "base"}}}, "with a template"},
		{"debian on a bad template", api.TemplateSpec{From: api.TemplateBase{Debian: &api.DebianBase{Template: "Base!", Packages: []string{"x"}}}}, "want name or name:tag"},
		{"debian without suite", api.TemplateSpec{From: api.TemplateBase{Debian: &api.DebianBase{Variant: "minbase"}}}, "not a Debian"},
		{"debian option", api.TemplateSpec{From: api.TemplateBase{Debian: &api.DebianBase{Suite: "bookworm", Variant: "minbase", Packages: []string{"--allow-unauthenticated"}}}}, "not a Debian"},
		{"debian shell", api.TemplateSpec{From: api.TemplateBase{Debian: &api.DebianBase{Suite: "bookworm", Variant: "minbase", Include: []string{"a;b"}}}}, "not a Debian"},
		{"two bases", api.TemplateSpec{From: api.TemplateBase{Template: "base", Image: "debian"}}, "exactly one of"},
		{"bad template", api.TemplateSpec{From: api.TemplateBase{Template: "Base!"}}, "want name or name:tag"},
		{"bad archive", api.TemplateSpec{From: api.TemplateBase{Archive: "abc"}}, "archive must be"},
		{"creds without image", api.TemplateSpec{From: api.TemplateBase{Template: "base", Registry: &api.RegistryAuth{}}}, "registry credentials"},
		{"unknown type", api.TemplateSpec{From: base, Steps: []api.TemplateStep{step("RUN", "x"), step("HEALTHCHECK", "x")}}, `step 2: unknown type "HEALTHCHECK"`},
		{"run no args", api.TemplateSpec{From: base, Steps: []api.TemplateStep{step("RUN")}}, "step 1 (RUN): want 1 to 2 arguments, got 0"},
		{"run blank", api.TemplateSpec{From: base, Steps: []api.TemplateStep{step("RUN", "  ")}}, "empty command"},
		{"run bad user", api.TemplateSpec{From: base, Steps: []api.TemplateStep{step("RUN", "x", "a b")}}, `user "a b"`},
		{"copy no hash", api.TemplateSpec{From: base, Steps: []api.TemplateStep{step("COPY", "a", "/b")}}, "files_hash must be"},
		{"copy bad mode", api.TemplateSpec{From: base, Steps: []api.TemplateStep{{Type: "COPY", Args: []string{"a", "/b", "", "u+x"}, FilesHash: hash64}}}, `mode "u+x"`},
		{"copy no dest", api.TemplateSpec{From: base, Steps: []api.TemplateStep{{Type: "COPY", Args: []string{"a", ""}, FilesHash: hash64}}}, "path: want"},
		{"hash on run", api.TemplateSpec{From: base, Steps: []api.TemplateStep{{Type: "RUN", Args: []string{"x"}, FilesHash: hash64}}}, "files_hash goes with"},
		{"env odd", api.TemplateSpec{From: base, Steps: []api.TemplateStep{step("ENV", "A")}}, "key, value pairs"},
		{"env bad name", api.TemplateSpec{From: base, Steps: []api.TemplateStep{step("ENV", "A-B", "1")}}, `variable name "A-B"`},
		{"workdir two", api.TemplateSpec{From: base, Steps: []api.TemplateStep{step("WORKDIR", "/a", "/b")}}, "want 1 argument(s), got 2"},
		{"nul", api.TemplateSpec{From: base, Steps: []api.TemplateStep{step("RUN", "a\x00b")}}, "no NUL"},
		{"huge arg", api.TemplateSpec{From: base, Steps: []api.TemplateStep{step("RUN", strings.Repeat("x", maxArgBytes+1))}}, "at most"},
		{"ready without start", api.TemplateSpec{From: base, ReadyCmd: "true"}, "needs a start command"},
		{"dockerfile line", api.TemplateSpec{From: base, Steps: []api.TemplateStep{{Type: "RUN", Line: 7}}}, "step 1 (RUN, Dockerfile line 7)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := validate(&tc.spec)
			if tc.msg == "" {
				if err != nil {
					t.Fatalf("validate: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.msg) || !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("validate = %v, want invalid_argument containing %q", err, tc.msg)
			}
		})
	}
}

// ENV values are evaluated host-side as double-quoted shell words.
func TestExpandWord(t *testing.T) {
	env := map[string]string{"HOME": "/root", "A": "1"}
	for _, tc := range []struct{ in, want, err string }{
		{in: "plain", want: "plain"},
		{in: "/opt/bin:${PATH}", want: "/opt/bin:" + defaultPath},
		{in: "$HOME/x-$A$A", want: "/root/x-11"},
		{in: "${UNSET}|$UNSET|", want: "||"},
		{in: `\$HOME \" \\ \x`, want: `$HOME " \ \x`},
		{in: "cost: $ 5", want: "cost: $ 5"},
		{in: "$(id)", err: "command substitution"},
		{in: "`id`", err: "command substitution"},
		{in: "${A:-b}", err: "command substitution"},
	} {
		got, err := expandWord(tc.in, env)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("expandWord(%q) = %q, %v; want error %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("expandWord(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	withPath := map[string]string{"PATH": "/bin"}
	if got, _ := expandWord("/x:$PATH", withPath); got != "/x:/bin" {
		t.Errorf("PATH from the env: got %q", got)
	}
}

// Relative paths resolve against the workdir; a trailing slash stays.
func TestResolvePath(t *testing.T) {
	for _, tc := range []struct{ wd, p, want string }{
		{"/home/user", "/abs", "/abs"},
		{"/home/user", "data", "/home/user/data"},
		{"/home/user", "data/", "/home/user/data/"},
		{"/home/user", ".", "/home/user/"},
		{"/", ".", "/"},
		{"/a", "../b", "/b"},
	} {
		if got := resolvePath(tc.wd, tc.p); got != tc.want {
			t.Errorf("resolvePath(%q, %q) = %q, want %q", tc.wd, tc.p, got, tc.want)
		}
	}
}

// A stack of layers too deep for the root filesystem's mount options is
// refused with a clear error, before a sandbox fails to mount it.
func TestCheckStack(t *testing.T) {
	dir := "/var/lib/kiln/layers/layers/" + hash64 + "/root"
	var dirs []string
	for len(dirs) < 30 {
		dirs = append(dirs, dir)
	}
	if err := checkStack(dirs); err != nil {
		t.Fatalf("30 layers: %v", err)
	}
	for len(dirs) < 40 {
		dirs = append(dirs, dir)
	}
	if err := checkStack(dirs); !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "the template has 40 layers") {
		t.Fatalf("40 layers: %v", err)
	}
}
