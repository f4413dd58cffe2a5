package e2b

import (
	"errors"
	"net/http"
	"strings"

	"github.com/kiln-sh/kiln/internal/edge"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/proxy"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// Who may use a sandbox's data plane. Every route on every port needs a
// credential for the sandbox, except a few public ones:
//
//   - envd (49983): the access token (X-Access-Token) or an API key of the
//     owner; public: GET /health, CORS preflights, and GET/POST /files,
//     which envd itself authorizes by the token or a URL signature;
//   - the code interpreter (49999): the access token, the traffic token
//     (E2B-Traffic-Access-Token, all the stock SDKs send to /contexts) or
//     an API key of the owner; public: GET /health; /execute also checks
//     the access token itself;
//   - other ports (the exposed-port proxy): the traffic token or an API
//     key of the owner, unless the sandbox's ports are public.
//
// The decision is made before a paused sandbox is woken and before any
// body is read. Public requests are admitted by the edge (Admit), which caps
// how many run at once.

// grant is the credential a data-plane request proved it has.
type grant int

const (
	grantNone    grant = iota // none: only public routes
	grantToken                // the sandbox's envd access token
	grantTraffic              // the sandbox's traffic access token
	grantAPIKey               // an API key of the sandbox's owner, or an admin key
)

// msgNoCredential is the code interpreter's and ports' refusal.
const msgNoCredential = "unauthorized: send the sandbox's access token (X-Access-Token), its traffic access token (" +
	proxy.HeaderTrafficToken + ") or an API key that owns it (X-API-Key)"

// msgEnvdUnauthorized is envd's own refusal (the SDKs' tests assert it).
const msgEnvdUnauthorized = "unauthorized access, please provide a valid access token or method signing if supported"

// authorizeData decides whether r may use port of sb, and answers it
// (401, 403 or 429) when not.
func (h *Handler) authorizeData(w http.ResponseWriter, r *http.Request, sb sandbox.Sandbox, port int) (grant, bool) {
	g := h.credential(r, sb)
	var ok bool
	switch port {
	case EnvdPort:
		ok = g == grantToken || g == grantAPIKey
	case JupyterPort:
		ok = g != grantNone
	default:
		ok = g == grantTraffic || g == grantAPIKey
	}
	if ok {
		_ = h.edge.Admit(r, true) // a credential is never refused
		return g, true
	}
	if h.publicData(r, sb, port) {
		if err := h.edge.Admit(r, false); err != nil {
			status, msg := h.problem(r, err)
			w.Header().Set("Connection", "close")
			writeStatus(w, status, msg)
			return grantNone, false
		}
		return grantNone, true
	}
	w.Header().Set("Connection", "close")
	switch port {
	case EnvdPort:
		writeStatus(w, http.StatusUnauthorized, msgEnvdUnauthorized)
	case JupyterPort:
		http.Error(w, msgNoCredential, http.StatusUnauthorized)
	default:
		proxy.Forbidden(w, sb.ID)
	}
	return grantNone, false
}

// publicData reports whether r is one of port's public requests.
func (h *Handler) publicData(r *http.Request, sb sandbox.Sandbox, port int) bool {
	switch port {
	case EnvdPort:
		switch {
		case r.Method == http.MethodGet && r.URL.Path == "/health":
			return true
		case r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "":
			return true // CORS preflight: browsers send no credentials
		case r.URL.Path == "/files" && (r.Method == http.MethodGet || r.Method == http.MethodPost):
			return true // envd checks the token or the URL's signature
		}
		return false
	case JupyterPort:
		return r.Method == http.MethodGet && r.URL.Path == "/health"
	}
	n, err := h.m.Network(sb.ID)
	return err == nil && n.Public
}

// credential is the strongest credential for sb that r carries.
func (h *Handler) credential(r *http.Request, sb sandbox.Sandbox) grant {
	if sameToken(r.Header.Get("X-Access-Token"), h.token(sb.ID)) {
		return grantToken
	}
	tok := r.Header.Get(proxy.HeaderTrafficToken)
	if tok == "" {
		tok = r.Header.Get(proxy.HeaderKilnToken)
	}
	if tok != "" && sameToken(tok, *h.trafficToken(sb.ID)) {
		return grantTraffic
	}
	if h.ownerKey(r, sb) {
		return grantAPIKey
	}
	return grantNone
}

// ownerKey reports whether r carries an API key (X-API-Key, or
// Authorization: Bearer) of sb's owner or an admin. envd's Authorization
// is Basic (the user name) and is not a key.
func (h *Handler) ownerKey(r *http.Request, sb sandbox.Sandbox) bool {
	if r.Header.Get("X-Api-Key") == "" && !bearer(r) {
		return false
	}
	kr := r
	if a := r.Header.Get("Authorization"); a != "" && !bearer(r) {
		kr = r.Clone(r.Context())
		kr.Header.Del("Authorization")
	}
	c, err := h.edge.Authenticate(kr, edge.AnyKey)
	if err != nil {
		if !errors.Is(err, errdefs.ErrUnauthenticated) && !errors.Is(err, errdefs.ErrPermissionDenied) {
			h.log.Warn("authenticating a data-plane request", "sandbox_id", sb.ID, "err", err)
		}
		return false
	}
	return c.Key.Admin || (c.Key.ID != "" && c.Key.ID == sb.Owner)
}

// bearer reports whether r's Authorization header is a Bearer token.
func bearer(r *http.Request) bool {
	scheme, _, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	return ok && strings.EqualFold(scheme, "Bearer")
}
