package e2b

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"

	"github.com/kiln-sh/kiln/internal/sandbox"
)

// AccessToken is the envd access token of sandbox id: an HMAC of the id
// under the server's secret, so it needs no storage and survives restarts
// of kiln serve.
func AccessToken(secret []byte, id sandbox.ID) string {
	return mac(secret, "envd-access-token:", id)
}

// TrafficToken is the traffic access token of sandbox id when it has no
// network of its own (whose token is random and stored with it): an HMAC
// like AccessToken's, under another label.
func TrafficToken(secret []byte, id sandbox.ID) string {
	return mac(secret, "traffic-access-token:", id)
}

func mac(secret []byte, label string, id sandbox.ID) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(label + id.String()))
	return hex.EncodeToString(m.Sum(nil))
}

// trafficToken is the token the SDKs send as E2B-Traffic-Access-Token to
// sb's ports other than envd's: the code interpreter's and the exposed
// ones. Every sandbox has one and the control plane always returns it
// (E2B returns it only for sandboxes whose ports are not public): the
// stock SDKs send no other credential to the code interpreter's
// /contexts routes, which therefore need it (or the access token, or the
// owner's API key). It is the network's token when the sandbox has a
// network, else TrafficToken.
func (h *Handler) trafficToken(id sandbox.ID) *string {
	t := TrafficToken(h.o.Secret, id)
	if n, err := h.m.Network(id); err == nil && n.Token != "" {
		t = n.Token
	}
	return &t
}

// sameToken compares a token a request carries with the one it must
// carry in constant time; "" never matches.
func sameToken(got, want string) bool {
	return got != "" && want != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}
