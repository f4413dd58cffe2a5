package e2b

import "github.com/kiln-sh/kiln/internal/sandbox"

// setAutoPause maps E2B's autoPause (lifecycle.onTimeout "pause") onto
// the sandbox: it is paused, not killed, when its timeout expires, and
// connect resumes it. E2B's autoResume (resume on any data-plane request)
// is not offered: a paused sandbox's data plane answers 502, as on E2B
// by default.
func setAutoPause(o *sandbox.CreateOptions, on bool) { o.AutoPause = on }

// onTimeout says what happens to sb at its timeout, as E2B's lifecycle
// names it.
func onTimeout(sb sandbox.Sandbox) string {
	if sb.AutoPause {
		return "pause"
	}
	return "kill"
}
