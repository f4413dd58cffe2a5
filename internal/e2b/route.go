package e2b

import (
	"context"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/kiln-sh/kiln/internal/e2b/envd"
	"github.com/kiln-sh/kiln/internal/edge"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/proxy"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// The data plane's routing headers and well-known sandbox ports.
const (
	headerSandboxID   = "E2b-Sandbox-Id"
	headerSandboxPort = "E2b-Sandbox-Port"
	// EnvdPort is envd's port: the process and filesystem services.
	EnvdPort = 49983
	// JupyterPort is the code interpreter's port.
	JupyterPort = 49999
)

// sandboxIDRE is what E2B's proxy accepts as a sandbox id.
var sandboxIDRE = regexp.MustCompile(`^[a-z0-9]+$`)

// hostRE matches a data-plane host: <port>-<sandbox id>.<anything>.
var hostRE = regexp.MustCompile(`^([0-9]{1,5})-([a-z0-9]+)\.`)

// hostTarget parses a <port>-<id>.<domain> host (with or without a
// :port suffix). The id must look like a sandbox id, so that a server
// named e.g. 1-api.example.com keeps its API.
func hostTarget(host string) (port int, id string, ok bool) {
	m := hostRE.FindStringSubmatch(hostname(host))
	if m == nil {
		return 0, "", false
	}
	port, err := strconv.Atoi(m[1])
	if err != nil || port < 1 || port > 65535 {
		return 0, "", false
	}
	if _, err := sandbox.ParseID(m[2]); err != nil {
		return 0, "", false
	}
	return port, m[2], true
}

// underDomain reports whether host (with or without a :port suffix) is a
// name under the sandboxes' domain, <something>.<domain>.
func (h *Handler) underDomain(host string) bool { return UnderDomain(host, h.o.Domain) }

// UnderDomain reports whether host (with or without a :port suffix) is a
// name under domain ("": none), <something>.<domain>.
func UnderDomain(host, domain string) bool {
	if domain == "" {
		return false
	}
	return strings.HasSuffix(hostname(host), "."+hostname(domain))
}

// WriteBadHost answers a request for a host under the sandboxes' domain
// that names no sandbox port: 404.
func WriteBadHost(w http.ResponseWriter, r *http.Request, domain string) {
	r.Pattern = "E2B bad host"
	writeStatus(w, http.StatusNotFound, "host "+errdefs.ClipN(r.Host, 80)+
		" names no sandbox port: want <port>-<sandbox id>."+domain)
}

// hostname is host without its :port and trailing dot, in lower case.
func hostname(host string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	return strings.ToLower(strings.TrimSuffix(host, "."))
}

// SignedFiles reports whether r is a header-less envd file URL made by
// sandbox.downloadUrl()/uploadUrl(): GET or POST /files with a signature.
func SignedFiles(r *http.Request) bool {
	return r.URL.Path == "/files" && (r.Method == http.MethodGet || r.Method == http.MethodPost) &&
		r.URL.Query().Has("signature")
}

// serveHeaderRouted serves a request routed by E2b-Sandbox-Id and
// E2b-Sandbox-Port; like E2B's proxy it wants both.
func (h *Handler) serveHeaderRouted(w http.ResponseWriter, r *http.Request) {
	id, rawPort := r.Header.Get(headerSandboxID), r.Header.Get(headerSandboxPort)
	switch {
	case id == "":
		writeStatus(w, http.StatusBadRequest, "Missing header: "+headerSandboxID)
		return
	case rawPort == "":
		writeStatus(w, http.StatusBadRequest, "Missing header: "+headerSandboxPort)
		return
	case !sandboxIDRE.MatchString(id):
		writeStatus(w, http.StatusBadRequest, "Invalid sandbox ID: "+errdefs.ClipN(id, 40))
		return
	}
	port, err := strconv.Atoi(rawPort)
	if err != nil || port < 1 || port > 65535 {
		writeStatus(w, http.StatusBadRequest, "Invalid sandbox port: "+errdefs.ClipN(rawPort, 10))
		return
	}
	h.serveData(w, r, id, port)
}

// serveData serves a data-plane request for port of sandbox id, which
// must be running on this node. Who may use which port is decided here,
// before a paused sandbox is woken for the request (see authorizeData);
// envd and the code interpreter's /execute check the access token again
// themselves.
func (h *Handler) serveData(w http.ResponseWriter, r *http.Request, rawID string, port int) {
	r.Pattern = "E2B :" + portLabel(port)
	edge.Annotate(r, rawID)
	sb, ok := h.record(r.Context(), rawID)
	if !ok {
		sandboxGone(w, rawID)
		return
	}
	grant, ok := h.authorizeData(w, r, sb, port)
	if !ok {
		return
	}
	// Granted by a credential of the sandbox (or its owner's key): any
	// owner's sandbox is usable here.
	sb, a, err := h.m.UseGranted(r.Context(), sb.ID)
	if err != nil {
		sandboxGone(w, rawID)
		return
	}
	switch port {
	case EnvdPort:
		token := h.token(sb.ID)
		if grant == grantAPIKey {
			token = "" // the owner's API key opens envd as the token does
		}
		h.envd.ServeSandbox(w, r, sb, a, token)
	case JupyterPort:
		h.serveJupyter(w, r, sb, a)
	default:
		if h.o.PortProxy != nil {
			edge.StreamBody(r) // an app's upload may pause: only an idle deadline
			if grant != grantNone {
				r = proxy.Grant(r, grant == grantAPIKey && bearer(r))
			}
			h.o.PortProxy(w, r, sb, port)
			return
		}
		writeJSON(w, http.StatusBadGateway, portClosedBody{Code: http.StatusBadGateway,
			Message: "The sandbox is running but port is not open", SandboxID: rawID, Port: port})
	}
}

// sandboxGone is E2B's answer for a sandbox that is not running here.
func sandboxGone(w http.ResponseWriter, rawID string) {
	writeJSON(w, http.StatusBadGateway, notFoundBody{Code: http.StatusBadGateway,
		Message: "The sandbox was not found", SandboxID: rawID})
}

// portLabel names a port for metrics without letting callers mint
// unbounded labels.
func portLabel(port int) string {
	switch port {
	case EnvdPort:
		return "envd"
	case JupyterPort:
		return "code-interpreter"
	}
	return "port"
}

// record returns sandbox rawID's record if it may be served: it is on
// this node and running, or paused (a request may wake it). A sandbox
// being killed (through this API, or by its timeout) is not: the SDK
// probes /health right after a kill and must get 502 without waiting for
// the kill to finish.
func (h *Handler) record(ctx context.Context, rawID string) (sandbox.Sandbox, bool) {
	id, err := sandbox.ParseID(rawID)
	if err != nil {
		return sandbox.Sandbox{}, false
	}
	if _, dying := h.dying.Load(id); dying || h.m.Ending(id) {
		return sandbox.Sandbox{}, false
	}
	sb, err := h.m.Get(ctx, id)
	if err != nil || (sb.State != sandbox.StateRunning && sb.State != sandbox.StatePaused) {
		return sandbox.Sandbox{}, false
	}
	return sb, true
}

// token is sandbox id's envd access token.
func (h *Handler) token(id sandbox.ID) string { return AccessToken(h.o.Secret, id) }

// serveSignedFiles serves a header-less /files URL by finding the live
// sandbox whose token made its signature.
func (h *Handler) serveSignedFiles(w http.ResponseWriter, r *http.Request) {
	r.Pattern = "E2B signed /files"
	sb, ok := h.Signer(r)
	if !ok {
		RefuseSigned(w, r)
		return
	}
	edge.Annotate(r, sb.ID.String())
	_ = h.edge.Admit(r, true) // the signature is a credential: never refused
	a, err := h.m.Agent(sb.ID)
	if err != nil {
		RefuseSigned(w, r)
		return
	}
	h.envd.ServeSandbox(w, r, sb, a, h.token(sb.ID))
}

// Signer returns the running sandbox of this node whose access token
// signed r, a header-less signed /files URL (SignedFiles): the signature
// names no sandbox, so every one is tried. An expired signature has none.
func (h *Handler) Signer(r *http.Request) (sandbox.Sandbox, bool) {
	if signatureExpired(r) {
		return sandbox.Sandbox{}, false
	}
	for _, sb := range h.m.Live() {
		if sb.State == sandbox.StateRunning && envd.Signed(r, h.token(sb.ID)) {
			return sb, true
		}
	}
	return sandbox.Sandbox{}, false
}

// signatureExpired reports whether r's signature_expiration is past.
func signatureExpired(r *http.Request) bool {
	exp := r.URL.Query().Get("signature_expiration")
	if exp == "" {
		return false
	}
	t, err := strconv.ParseInt(exp, 10, 64)
	return err == nil && t < time.Now().Unix()
}

// RefuseSigned answers a signed /files URL that no running sandbox
// signed (or whose signature expired) as envd does.
func RefuseSigned(w http.ResponseWriter, r *http.Request) {
	if signatureExpired(r) {
		writeStatus(w, http.StatusUnauthorized, "signature is already expired")
		return
	}
	writeStatus(w, http.StatusUnauthorized, "invalid signature")
}
