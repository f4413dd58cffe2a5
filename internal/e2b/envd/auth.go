package envd

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Access-token failures, with envd's exact messages (the SDK tests assert
// some of them).
const (
	msgUnauthorized  = "unauthorized access, please provide a valid access token or method signing if supported"
	msgTokenMismatch = "access token present in header but does not match"
	msgNoSignature   = "missing signature query parameter"
	msgBadSignature  = "invalid signature"
	msgExpired       = "signature is already expired"
)

// authorized checks a request against the sandbox's access token: every
// request carries it as X-Access-Token, except GET /health and /files,
// which may carry a URL signature instead. An empty token (an insecure
// sandbox) lets everything through. The message explains a refusal.
func authorized(r *http.Request, token string) (string, bool) {
	switch {
	case token == "":
		return "", true
	case r.Method == http.MethodGet && r.URL.Path == "/health":
		return "", true
	case isFiles(r):
		return validSigning(r, token, time.Now())
	case !sameToken(r.Header.Get("X-Access-Token"), token):
		return msgUnauthorized, false
	}
	return "", true
}

// Signed reports whether r, a GET or POST /files without routing headers
// (a sandbox.downloadUrl()/uploadUrl() URL), carries a valid, unexpired
// signature made with token.
func Signed(r *http.Request, token string) bool {
	if token == "" || !isFiles(r) || !r.URL.Query().Has("signature") {
		return false
	}
	_, ok := validSigning(r, token, time.Now())
	return ok
}

func isFiles(r *http.Request) bool {
	return r.URL.Path == "/files" && (r.Method == http.MethodGet || r.Method == http.MethodPost)
}

// validSigning authorizes a /files request by its X-Access-Token header,
// else by its signature and signature_expiration query parameters.
func validSigning(r *http.Request, token string, now time.Time) (string, bool) {
	if h := r.Header.Get("X-Access-Token"); h != "" {
		if !sameToken(h, token) {
			return msgTokenMismatch, false
		}
		return "", true
	}
	q := r.URL.Query()
	if !q.Has("signature") {
		return msgNoSignature, false
	}
	op := "read"
	if r.Method == http.MethodPost {
		op = "write"
	}
	exp := q.Get("signature_expiration")
	var expires int64
	if q.Has("signature_expiration") {
		n, err := strconv.ParseInt(exp, 10, 64)
		if err != nil {
			return msgBadSignature, false
		}
		expires = n
	}
	want := Signature(q.Get("path"), op, q.Get("username"), token, exp)
	if !sameToken(q.Get("signature"), want) {
		return msgBadSignature, false
	}
	if q.Has("signature_expiration") && expires < now.Unix() {
		return msgExpired, false
	}
	return "", true
}

// Signature is envd's URL signature of an operation ("read" or "write")
// on path for username (the raw query values), made with the sandbox's
// token; expiration (unix seconds) is empty for a signature that never
// expires.
func Signature(path, op, username, token, expiration string) string {
	parts := []string{path, op, username, token}
	if expiration != "" {
		parts = append(parts, expiration)
	}
	sum := sha256.Sum256([]byte(strings.Join(parts, ":")))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}

func sameToken(got, want string) bool {
	return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}
