// Package boundary_test checks the trust and layering boundaries of the
// module: code that runs inside sandboxes imports nothing host-side, the
// host reaches the agent only through the contract (internal/agentapi),
// the domain does not import its front ends, the front ends meet only in
// the HTTP edge (internal/edge), the SDK depends on nothing
// internal, every package says what it is, and go.mod is tidy.
//
// The rules are checked against this module and against a fixture module
// (testdata/boundary) whose wrong imports they must report.
package boundary_test

import (
	"encoding/json"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/kiln-sh/kiln"

type pkg struct {
	ImportPath   string
	Dir          string
	Doc          string
	Imports      []string
	Deps         []string
	GoFiles      []string
	TestGoFiles  []string
	XTestGoFiles []string
}

// load lists the packages of the module rooted at dir.
func load(t *testing.T, dir string) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-json=ImportPath,Dir,Doc,Imports,Deps,GoFiles,TestGoFiles,XTestGoFiles", "./...")
	cmd.Dir = dir
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list in %s: %v", dir, err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

func stdlib(imp string) bool { return !strings.Contains(strings.SplitN(imp, "/", 2)[0], ".") }

func under(imp, prefix string) bool { return imp == prefix || strings.HasPrefix(imp, prefix+"/") }

// rule constrains the imports of the packages it applies to.
type rule struct {
	name    string
	applies func(p string) bool
	allowed func(imp string) bool
	deps    bool // check every dependency, not only direct imports
}

func rules(mod string) []rule {
	agentSide := func(p string) bool {
		return under(p, mod+"/internal/agent") || p == mod+"/cmd/kiln-agent"
	}
	return []rule{
		{
			name:    "in-sandbox code imports only the contracts, itself and the standard library",
			applies: agentSide,
			allowed: func(imp string) bool {
				return stdlib(imp) || imp == mod+"/api" ||
					under(imp, mod+"/internal/agent") || under(imp, mod+"/internal/agentapi") ||
					strings.HasPrefix(imp, "golang.org/x/sys/") ||
					imp == "github.com/creack/pty" ||
					under(imp, "github.com/go-zeromq/zmq4") // kernel/jupyter
			},
		},
		{
			name:    "the host-agent contract imports only api and the standard library",
			applies: func(p string) bool { return under(p, mod+"/internal/agentapi") },
			allowed: func(imp string) bool {
				return stdlib(imp) || imp == mod+"/api" || under(imp, mod+"/internal/agentapi")
			},
		},
		{
			name:    "host code reaches the agent only through the contract",
			applies: func(p string) bool { return under(p, mod) && !agentSide(p) },
			allowed: func(imp string) bool { return !under(imp, mod+"/internal/agent") },
		},
		{
			name:    "the sandbox domain depends on no front end",
			applies: func(p string) bool { return under(p, mod+"/internal/sandbox") },
			allowed: func(imp string) bool {
				return !under(imp, mod+"/internal/server") && !under(imp, mod+"/internal/e2b")
			},
			deps: true,
		},
		{
			name:    "the front ends meet only in the HTTP edge: E2B's does not import the native one",
			applies: func(p string) bool { return under(p, mod+"/internal/e2b") },
			allowed: func(imp string) bool { return !under(imp, mod+"/internal/server") },
			deps:    true,
		},
		{
			name:    "the HTTP edge depends on no front end",
			applies: func(p string) bool { return under(p, mod+"/internal/edge") },
			allowed: func(imp string) bool {
				return !under(imp, mod+"/internal/server") && !under(imp, mod+"/internal/e2b")
			},
			deps: true,
		},
		{
			name:    "the SDK imports only the contract and the standard library",
			applies: func(p string) bool { return under(p, mod+"/client") || under(p, mod+"/api") },
			allowed: func(imp string) bool {
				// The Dockerfile front end compiles on the client, as E2B's SDK does.
				return stdlib(imp) || imp == mod+"/api" || imp == "github.com/coder/websocket" ||
					imp == mod+"/internal/template/dockerfile"
			},
		},
	}
}

// violations checks pkgs of module mod against every rule and the package
// doc requirement.
func violations(t *testing.T, mod string, pkgs []pkg) []string {
	var out []string
	for _, r := range rules(mod) {
		for _, p := range pkgs {
			if !r.applies(p.ImportPath) {
				continue
			}
			imps := p.Imports
			if r.deps {
				imps = p.Deps
			}
			for _, imp := range imps {
				if !r.allowed(imp) {
					out = append(out, r.name+": "+p.ImportPath+" imports "+imp)
				}
			}
		}
	}
	for _, p := range pkgs {
		if !hasDoc(t, p) {
			out = append(out, "package doc: "+p.ImportPath+" has none")
		}
	}
	return out
}

// hasDoc reports whether a package has a package comment; for a package of
// test files only (go list reports no Doc then) it reads the test files.
func hasDoc(t *testing.T, p pkg) bool {
	if p.Doc != "" {
		return true
	}
	if len(p.GoFiles) > 0 {
		return false
	}
	files := append(slices.Clone(p.TestGoFiles), p.XTestGoFiles...)
	for _, f := range files {
		af, err := parser.ParseFile(token.NewFileSet(), filepath.Join(p.Dir, f), nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		if af.Doc != nil {
			return true
		}
	}
	return false
}

func TestBoundaries(t *testing.T) {
	for _, v := range violations(t, module, load(t, "..")) {
		t.Error(v)
	}
}

// TestBoundariesCatchWrongImports runs the same rules on a fixture module
// with a deliberately wrong import of each kind.
func TestBoundariesCatchWrongImports(t *testing.T) {
	const fix = "example.com/fixture"
	got := violations(t, fix, load(t, filepath.Join("testdata", "boundary")))
	want := []string{
		"in-sandbox code imports only the contracts, itself and the standard library: " + fix + "/internal/agent/bad imports " + fix + "/internal/server",
		"the sandbox domain depends on no front end: " + fix + "/internal/sandbox imports " + fix + "/internal/server",
		"the front ends meet only in the HTTP edge: E2B's does not import the native one: " + fix + "/internal/e2b imports " + fix + "/internal/server",
		"the HTTP edge depends on no front end: " + fix + "/internal/edge imports " + fix + "/internal/server",
		"package doc: " + fix + "/internal/nodoc has none",
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("violations in the fixture:\n got %q\nwant %q", got, want)
	}
}

// TestModTidy fails when go.mod or go.sum is not what `go mod tidy` makes
// (a direct dependency marked indirect, a stale requirement).
func TestModTidy(t *testing.T) {
	cmd := exec.Command("go", "mod", "tidy", "-diff")
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("go.mod is not tidy (run go mod tidy):\n%s", out)
	}
}
