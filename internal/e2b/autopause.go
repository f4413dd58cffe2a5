package e2b

import "github.com/kiln-sh/kiln/internal/sandbox"

// onTimeout says what happens to sb at its timeout, as E2B's lifecycle
// names it.
func onTimeout(sb sandbox.Sandbox) string {
	if sb.AutoPause {
		return "pause"
	}
	return "kill"
}
