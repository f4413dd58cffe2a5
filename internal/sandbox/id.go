package sandbox

import (
	"crypto/rand"
	"fmt"
	"regexp"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// ID names a sandbox. It is safe to use in host paths, cgroup paths,
// runtime ids and hostnames: parse untrusted strings with ParseID.
type ID string

const idAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

var idRE = regexp.MustCompile(`^[a-z0-9]{8,32}$`)

// NewID returns a random 20-character ID.
func NewID() ID {
	b := make([]byte, 20)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = idAlphabet[int(b[i])%len(idAlphabet)]
	}
	// A leading letter keeps it a valid hostname label everywhere.
	b[0] = idAlphabet[int(b[0])%26]
	return ID(b)
}

// ParseID validates an ID from an untrusted source.
func ParseID(s string) (ID, error) {
	if !idRE.MatchString(s) {
		return "", fmt.Errorf("sandbox id %q: %w", s, errdefs.ErrInvalidArgument)
	}
	return ID(s), nil
}

func (id ID) String() string { return string(id) }
