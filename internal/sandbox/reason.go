package sandbox

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"unicode/utf8"
)

// maxReason bounds a sandbox's failure or stop reason.
const maxReason = 200

// foreignID matches what may be another sandbox's id (NewID's form: 20
// characters, a letter first, with a digit) — the shared warm
// checkpoint's, say — which a reason must not show.
var foreignID = regexp.MustCompile(`\b[a-z][a-z0-9]{19}\b`)

// shortReason shapes the reason recorded for sandbox id, which its owner
// sees: the first line only (no stack dumps), no host paths, no other
// sandbox's id, at most maxReason bytes. Every reason a record gets goes
// through it; the caller logs the full text.
func (m *Manager) shortReason(id ID, reason string) string {
	reason, _, _ = strings.Cut(strings.TrimSpace(reason), "\n")
	for _, dir := range []string{m.cfg.StateDir, m.cfg.DataDir, m.cfg.RunDir} {
		if len(dir) > 1 {
			reason = strings.ReplaceAll(reason, dir, "…")
		}
	}
	reason = foreignID.ReplaceAllStringFunc(reason, func(s string) string {
		if s == string(id) || !strings.ContainsAny(s, "0123456789") {
			return s
		}
		return "…"
	})
	reason = strings.ToValidUTF8(strings.TrimSpace(reason), "")
	if len(reason) > maxReason {
		n := maxReason
		for n > 0 && !utf8.RuneStart(reason[n]) {
			n--
		}
		reason = reason[:n] + "…"
	}
	return reason
}

// agentCrash returns the line of the agent's log in dir that says why a
// Go program died ("panic: …", "fatal error: …", "SIGSEGV: …"), and the
// log's last bytes for the server log; "" if there is neither.
func agentCrash(dir string) (line, tail string) {
	f, err := os.Open(filepath.Join(dir, agentLog))
	if err != nil {
		return "", ""
	}
	defer f.Close()
	const window = 64 << 10
	if fi, err := f.Stat(); err == nil && fi.Size() > window {
		_, _ = f.Seek(-window, io.SeekEnd)
	}
	b, _ := io.ReadAll(io.LimitReader(f, window))
	tail = string(b[max(0, len(b)-2048):])
	for l := range bytes.Lines(b) {
		if crashLine.Match(l) {
			line = string(bytes.TrimSpace(l))
		}
	}
	return line, strings.TrimSpace(tail)
}

var crashLine = regexp.MustCompile(`^(panic: |fatal error: |SIG[A-Z]+: )`)
