// Package boundary_test checks the trust and layering boundaries of the
// module: code that runs inside sandboxes imports nothing host-side, and
// the SDK depends on nothing internal.
package boundary_test

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/kiln-sh/kiln"

type pkg struct {
	ImportPath string
	Imports    []string
}

func listPackages(t *testing.T, patterns ...string) []pkg {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list", "-json=ImportPath,Imports"}, patterns...)...).Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
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

func TestBoundaries(t *testing.T) {
	tests := []struct {
		name     string
		patterns []string
		allowed  func(imp string) bool
	}{
		{
			name:     "in-sandbox code imports only the contract, itself and the standard library",
			patterns: []string{module + "/internal/agent/...", module + "/cmd/kiln-agent"},
			allowed: func(imp string) bool {
				return !strings.Contains(imp, ".") || // standard library
					imp == module+"/api" ||
					strings.HasPrefix(imp, module+"/internal/agent") ||
					strings.HasPrefix(imp, "golang.org/x/sys/") ||
					imp == "github.com/creack/pty" ||
					strings.HasPrefix(imp, "github.com/go-zeromq/zmq4") // kernel/jupyter
			},
		},
		{
			name:     "the SDK imports only the contract and the standard library",
			patterns: []string{module + "/client/...", module + "/api/..."},
			allowed: func(imp string) bool {
				return !strings.Contains(imp, ".") || imp == module+"/api" || imp == "github.com/coder/websocket"
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, p := range listPackages(t, tt.patterns...) {
				for _, imp := range p.Imports {
					if !tt.allowed(imp) {
						t.Errorf("%s imports %s", p.ImportPath, imp)
					}
				}
			}
		})
	}
}
