package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/oci/ocitest"
	"github.com/kiln-sh/kiln/internal/template"
)

// buildKiln builds kiln and kiln-agent side by side, as make build does.
func buildKiln(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, b := range []struct{ out, pkg, cgo string }{
		{"kiln", ".", "1"},
		{"kiln-agent", "../kiln-agent", "0"},
	} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, b.out), b.pkg)
		cmd.Env = append(os.Environ(), "CGO_ENABLED="+b.cgo)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("building %s: %v\n%s", b.out, err, out)
		}
	}
	return filepath.Join(dir, "kiln")
}

// TestKilnRun runs the one-shot command end to end: a fresh sandbox per
// run, output streamed, the command's exit code, nothing left behind.
func TestKilnRun(t *testing.T) {
	ocitest.RequireRoot(t)
	_, err := template.Lookup(config.FromEnv().DataDir, "base")
	ocitest.Require(t, err == nil, fmt.Sprintf("base template not built (make setup): %v", err))
	kiln := buildKiln(t)
	script := filepath.Join(t.TempDir(), "hello.py")
	os.WriteFile(script, []byte("import sys\nprint('args', sys.argv[1:])\nsys.exit(4)\n"), 0o644)

	tests := []struct {
		name       string
		args       []string
		wantOut    string
		wantStderr string
		wantCode   int
	}{
		{"argv", []string{"--", "python3", "-c", "print(1)"}, "1\n", "", 0},
		{"exit code", []string{"--runtime", "runc", "--", "sh", "-c", "echo out; echo err >&2; exit 7"}, "out\n", "err\n", 7},
		{"script", []string{script, "a", "b"}, "args ['a', 'b']\n", "", 4},
		{"env and limits", []string{"--env", "X=y", "--memory", "256M", "--", "sh", "-c", "echo $X"}, "y\n", "", 0},
		{"timeout", []string{"--timeout", "1s", "--", "sleep", "30"}, "", "timeout", 137},
		{"unknown template", []string{"--template", "nope", "--", "true"}, "", "not found", 1},
		{"bad memory", []string{"--memory", "1K", "--", "true"}, "", "memory", 1},
		{"no command", nil, "", "Usage", 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(kiln, append([]string{"run"}, tt.args...)...)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tt.wantCode || stdout.String() != tt.wantOut || !strings.Contains(stderr.String(), tt.wantStderr) {
				t.Errorf("kiln run %v: code %d stdout %q stderr %q; want %d %q, stderr containing %q",
					tt.args, code, stdout.String(), stderr.String(), tt.wantCode, tt.wantOut, tt.wantStderr)
			}
		})
	}
	// Every run destroyed its sandbox and removed its private state.
	if ents, _ := filepath.Glob(filepath.Join(config.FromEnv().DataDir, "run-*")); len(ents) != 0 {
		t.Errorf("kiln run left state behind: %v", ents)
	}
}
