package e2b

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"

	"github.com/kiln-sh/kiln/internal/sandbox"
)

// AccessToken is the envd access token of sandbox id: an HMAC of the id
// under the server's secret, so it needs no storage and survives restarts
// of kiln serve.
func AccessToken(secret []byte, id sandbox.ID) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte("envd-access-token:" + id.String()))
	return hex.EncodeToString(mac.Sum(nil))
}
