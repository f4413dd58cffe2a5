package e2b

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"time"

	"github.com/kiln-sh/kiln/internal/edge"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/template"
)

// The files of a build's COPY steps. E2B's API answers a presigned URL of
// its object store; Kiln answers a URL of its own, PUT
// /templates/{templateID}/files/{hash}, signed for the caller's key and
// that hash (the SDKs send no API key with the PUT), which stores the
// tar where the key's builds read uploads (builder.PutFiles: bounded by
// the server's upload limit, 413 over it).

// uploadTTL is how long an upload URL is valid (E2B's SDK allows an
// upload an hour).
const uploadTTL = time.Hour

var filesHashRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// uploadSignature signs an upload of hash by owner until expires (Unix
// seconds).
func uploadSignature(secret []byte, owner, hash, expires string) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("template-upload:" + owner + "\x00" + hash + "\x00" + expires))
	return hex.EncodeToString(m.Sum(nil))
}

// fileUploadLink is GET /templates/{templateID}/files/{hash} (201):
// whether the caller's key has the files already, and the URL to PUT them
// to (always given: the SDK's forceUpload uploads again).
func (h *Handler) fileUploadLink(w http.ResponseWriter, r *http.Request, c Caller) error {
	if err := h.templatesOn(); err != nil {
		return err
	}
	name, hash := r.PathValue("templateID"), r.PathValue("hash")
	if !filesHashRE.MatchString(hash) {
		return invalid("files hash: want 64 lowercase hex digits (a SHA-256)")
	}
	recs, err := h.o.Builder.List(r.Context(), c.Owner, name, 1)
	if err != nil {
		return err
	}
	if !template.ValidName(name) || len(recs) == 0 {
		return fmt.Errorf("template '%s' not found: %w", errdefs.ClipN(name, 64), errdefs.ErrNotFound)
	}
	present, err := h.o.Builder.HasFiles(c.Owner, hash)
	if err != nil {
		return err
	}
	expires := strconv.FormatInt(time.Now().Add(uploadTTL).Unix(), 10)
	q := url.Values{"owner": {c.Owner}, "expires": {expires}, "signature": {uploadSignature(h.o.Secret, c.Owner, hash, expires)}}
	u := url.URL{Scheme: "http", Host: linkHost(r), Path: "/templates/" + name + "/files/" + hash, RawQuery: q.Encode()}
	if r.TLS != nil || r.Header.Get("X-Forwarded-Proto") == "https" {
		u.Scheme = "https"
	}
	writeJSON(w, http.StatusCreated, templateFileUpload{Present: present, URL: u.String()})
	return nil
}

// linkHost is the host an upload link names: the one the client asked
// (X-Forwarded-Host, from a cluster's front or another reverse proxy,
// when it is a plain host[:port]), else the request's; behind a front a
// node's own address is refused to clients, and the front routes the
// upload here by the owner the link names.
func linkHost(r *http.Request) string {
	if fh := r.Header.Get("X-Forwarded-Host"); fh != "" && len(fh) <= 255 && plainHostRE.MatchString(fh) {
		return fh
	}
	return r.Host
}

var plainHostRE = regexp.MustCompile(`^([A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?$`)

// uploadFiles is PUT /templates/{templateID}/files/{hash} with a
// signature fileUploadLink made: it stores the body as the signing key's
// upload of hash (200).
func (h *Handler) uploadFiles(w http.ResponseWriter, r *http.Request) {
	r.Pattern = "E2B template upload"
	q, hash := r.URL.Query(), r.PathValue("hash")
	owner, expires := q.Get("owner"), q.Get("expires")
	exp, err := strconv.ParseInt(expires, 10, 64)
	valid := err == nil && filesHashRE.MatchString(hash) &&
		hmac.Equal([]byte(q.Get("signature")), []byte(uploadSignature(h.o.Secret, owner, hash, expires)))
	if !valid || exp < time.Now().Unix() {
		if err := h.edge.Admit(r, false); err != nil {
			h.writeError(w, r, err)
			return
		}
		msg := "invalid upload signature: ask GET /templates/{templateID}/files/{hash} for an upload URL"
		if valid {
			msg = "the upload URL has expired"
		}
		writeStatus(w, http.StatusForbidden, msg)
		return
	}
	_ = h.edge.Admit(r, true) // the signature is a credential: never refused
	if err := h.templatesOn(); err != nil {
		h.writeError(w, r, err)
		return
	}
	edge.StreamBody(r) // a large upload may pause: only an idle deadline
	if err := h.o.Builder.PutFiles(owner, hash, r.Body, r.ContentLength); err != nil {
		h.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusOK)
}
