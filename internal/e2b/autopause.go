package e2b

import "github.com/kiln-sh/kiln/internal/sandbox"

// setAutoPause maps E2B's autoPause (lifecycle.onTimeout "pause") onto
// the sandbox's options. Kiln's sandboxes are killed at their timeout
// until sandbox.CreateOptions learns to pause them instead; until then
// autoPause is accepted and ignored.
func setAutoPause(_ *sandbox.CreateOptions, _ bool) {}

// onTimeout says what happens to sb at its timeout, as E2B's lifecycle
// names it.
func onTimeout(sandbox.Sandbox) string { return "kill" }
