// Package sandboxtest helps tests that run real sandboxes.
package sandboxtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Main builds kiln-agent once for a test package, stores its path in
// *agentPath, runs the tests and removes the build. Use it from TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(sandboxtest.Main(m, &agentPath)) }
func Main(m *testing.M, agentPath *string) int {
	dir, err := os.MkdirTemp("", "kiln-agent-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	*agentPath = filepath.Join(dir, "kiln-agent")
	cmd := exec.Command("go", "build", "-o", *agentPath, "github.com/kiln-sh/kiln/cmd/kiln-agent")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building kiln-agent: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}
