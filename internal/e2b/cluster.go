package e2b

import (
	"cmp"
	"net/http"
	"strconv"
	"strings"

	"github.com/kiln-sh/kiln/internal/edge"
)

// What a cluster front (internal/server front.go) needs to route E2B's
// API to the node that owns a sandbox without serving it itself.

// Target reports the sandbox (and port) a data-plane request is for: its
// E2b-Sandbox-Id header (and E2b-Sandbox-Port, 0 if missing or bad), else
// a <port>-<id>.<domain> host. ok is false for any other request.
func Target(r *http.Request) (id string, port int, ok bool) {
	if id = r.Header.Get(headerSandboxID); id != "" {
		port, _ = strconv.Atoi(r.Header.Get(headerSandboxPort))
		return id, port, true
	}
	port, id, ok = hostTarget(r.Host)
	return id, port, ok
}

// RouteByHeaders turns a request for (id, port) into one routed by
// E2B's headers, which a node serves whatever its own domain is.
func RouteByHeaders(r *http.Request, id string, port int) {
	r.Header.Set(headerSandboxID, id)
	r.Header.Set(headerSandboxPort, strconv.Itoa(port))
}

// SandboxOfPath returns the sandbox id of a control-plane path about one
// sandbox (/sandboxes/{id}[/…], /v2/sandboxes/{id}[/…]); ok is false for
// any other path (lists, /sandboxes/metrics, creates).
func SandboxOfPath(p string) (id string, ok bool) {
	rest, found := strings.CutPrefix(p, "/sandboxes/")
	if !found {
		rest, found = strings.CutPrefix(p, "/v2/sandboxes/")
	}
	if !found {
		return "", false
	}
	id, _, _ = strings.Cut(rest, "/")
	if id == "" || id == "metrics" {
		return "", false
	}
	return id, true
}

// VolumeOfPath returns the volume id of a path about one volume:
// /volumes/{id} (API key) or /volumecontent/{id}/… (content, authorised
// by the volume's token); ok is false for any other path.
func VolumeOfPath(p string) (id string, content, ok bool) {
	if rest, found := strings.CutPrefix(p, "/volumes/"); found && rest != "" && !strings.Contains(rest, "/") {
		return rest, false, true
	}
	if rest, found := strings.CutPrefix(p, "/volumecontent/"); found {
		if id, _, _ = strings.Cut(rest, "/"); id != "" {
			return id, true, true
		}
	}
	return "", false, false
}

// IsCreate reports whether r creates a sandbox.
func IsCreate(r *http.Request) bool {
	return r.Method == http.MethodPost && (r.URL.Path == "/sandboxes" || r.URL.Path == "/v2/sandboxes")
}

// WriteProblem answers err as E2B's error JSON, with the status and
// message the edge gives it.
func WriteProblem(w http.ResponseWriter, r *http.Request, e *edge.Edge, err error) {
	if edge.Started(w) || r.Context().Err() != nil {
		return
	}
	pe, status := e.Problem(r.Context(), err)
	writeStatus(w, status, pe.Message)
}

// WriteGone is the data plane's answer for a sandbox that is not running
// (E2B's 502, which the SDKs read as "the sandbox is gone").
func WriteGone(w http.ResponseWriter, rawID string) { sandboxGone(w, rawID) }

// TemplateRoute classes E2B's template routes that must reach one node,
// for a front (TemplateRouteOf).
type TemplateRoute int

const (
	NotTemplate     TemplateRoute = iota
	TemplateNew                   // POST /v3/templates: a build's request
	TemplateStart                 // POST /v2/templates/{t}/builds/{b}: its steps, which start it
	TemplateStatus                // GET /templates/{t}/builds/{b}/status: its status and log
	TemplateFileAsk               // GET /templates/{t}/files/{hash}: an upload link, or "present"
	TemplateFilePut               // PUT /templates/{t}/files/{hash}: an upload by a signed link
	TemplateItself                // /templates/{t}: the template's info, change or delete
)

// TemplateRouteOf classes r among E2B's template routes that hold state on
// one node between requests (a pending build, uploaded files, a build's
// log, upload links signed with that node's secret), with the template
// and build its path names. Any other request (tags, aliases, lists: the
// shared catalog's) is NotTemplate.
func TemplateRouteOf(r *http.Request) (route TemplateRoute, tmpl, build string) {
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/"), "/")
	get, post := r.Method == http.MethodGet, r.Method == http.MethodPost
	switch {
	case post && r.URL.Path == "/v3/templates":
		return TemplateNew, "", ""
	case post && len(parts) == 5 && parts[0] == "v2" && parts[1] == "templates" && parts[3] == "builds":
		return TemplateStart, parts[2], parts[4]
	case get && len(parts) == 5 && parts[0] == "templates" && parts[2] == "builds" && parts[4] == "status":
		return TemplateStatus, parts[1], parts[3]
	case get && len(parts) == 4 && parts[0] == "templates" && parts[2] == "files":
		return TemplateFileAsk, parts[1], ""
	case r.Method == http.MethodPut && len(parts) == 4 && parts[0] == "templates" && parts[2] == "files":
		return TemplateFilePut, parts[1], ""
	case len(parts) == 2 && parts[0] == "templates" && parts[1] != "" && parts[1] != "tags":
		return TemplateItself, parts[1], ""
	}
	return NotTemplate, "", ""
}

// KilnTemplate is the Kiln template an E2B template id names (E2B's
// aliases of the built-ins, e.g. code-interpreter-v1, are Kiln's names),
// for a front that places a create by it.
func KilnTemplate(templateID string) string { return kilnTemplate(cmp.Or(templateID, "base")) }
