package e2b

import (
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/kiln-sh/kiln/internal/template"
	"github.com/kiln-sh/kiln/internal/template/builder"
)

// maxLogPage is the most log entries one status answer carries (E2B's
// limit).
const maxLogPage = 100

// errPageFull ends a log read once a page is full.
var errPageFull = errors.New("page full")

// buildStatus is GET /templates/{templateID}/builds/{buildID}/status
// ?logsOffset=&limit=: the build's state, its log entries from logsOffset
// (the SDK adds how many it got), and, for a failed build, the reason and
// the step it names.
func (h *Handler) buildStatus(w http.ResponseWriter, r *http.Request, c Caller) error {
	if err := h.templatesOn(); err != nil {
		return err
	}
	q := r.URL.Query()
	offset, err := intQuery(q.Get("logsOffset"), 0, 0, 1<<31-1, "logsOffset")
	if err != nil {
		return err
	}
	limit, err := intQuery(q.Get("limit"), maxLogPage, 0, maxLogPage, "limit")
	if err != nil {
		return err
	}
	rec, err := h.visibleBuild(r, c)
	if err != nil {
		return err
	}
	out := templateBuildInfo{TemplateID: rec.Template, BuildID: rec.ID, Status: rec.Status, Logs: []string{}, LogEntries: []buildLogEntry{}}
	if rec.Status != template.BuildWaiting && limit > 0 {
		err := h.o.Builder.Logs(r.Context(), rec.ID, offset, false, func(e builder.LogEntry) error {
			le := buildLogEntry{Timestamp: stampOf(e.Time), Level: e.Level, Message: e.Message}
			if e.Step >= 0 {
				le.Step = strconv.Itoa(e.Step + 1)
			}
			out.LogEntries = append(out.LogEntries, le)
			out.Logs = append(out.Logs, e.Message)
			if len(out.LogEntries) == limit {
				return errPageFull
			}
			return nil
		})
		if err != nil && !errors.Is(err, errPageFull) {
			return err
		}
	}
	if rec.Status == template.BuildError {
		out.Reason = &buildStatusReason{Message: rec.Reason, Step: failedStep(rec)}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// failedStep is the step a failed build's reason names, as E2B's SDK maps
// it back to the caller's code: the step's number (1: the first step after
// the base), "base" or "finalize" (the start and ready commands).
func failedStep(rec template.BuildRecord) string {
	switch {
	case rec.Step >= 0:
		return strconv.Itoa(rec.Step + 1)
	case strings.HasPrefix(rec.Reason, "finalize"):
		return "finalize"
	}
	return "base"
}

// intQuery parses an integer query parameter (def when absent) within
// [lo, hi].
func intQuery(s string, def, lo, hi int, name string) (int, error) {
	if s == "" {
		return def, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < lo || n > hi {
		return 0, invalid("%s: want an integer from %d to %d", name, lo, hi)
	}
	return n, nil
}
