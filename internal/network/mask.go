package network

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// PortVar stands for the port in a mask host (E2B's maskRequestHost).
const PortVar = "${PORT}"

// ValidateMaskHost checks a mask host: "" (none), or a host name or IP
// address with an optional port, in which PortVar may stand for the
// port the request goes to ("${PORT}-app.example.com", "app:${PORT}").
// Nothing else: no scheme, path, user or spaces.
func ValidateMaskHost(mask string) error {
	if mask == "" {
		return nil
	}
	bad := func() error {
		return fmt.Errorf("mask host %q: want host or host:port (%s stands for the port): %w",
			errdefs.ClipN(mask, 64), PortVar, errdefs.ErrInvalidArgument)
	}
	if len(mask) > maxDomainLen {
		return bad()
	}
	s := strings.ReplaceAll(mask, PortVar, "1")
	host, port := s, ""
	if h, p, err := net.SplitHostPort(s); err == nil {
		host, port = h, p
	} else if strings.Contains(s, ":") && !strings.HasPrefix(s, "[") {
		return bad()
	}
	if port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return bad()
		}
	}
	if _, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return nil
	}
	if !validHostName(host) {
		return bad()
	}
	return nil
}

// validHostName reports whether s is a DNS host name: dot-separated
// labels of letters, digits, '-' and '_', 1-63 bytes each, not starting or
// ending with '-'.
func validHostName(s string) bool {
	s = strings.TrimSuffix(s, ".")
	if s == "" || len(s) > maxDomainLen {
		return false
	}
	for _, l := range strings.Split(s, ".") {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for _, c := range []byte(l) {
			ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
			if !ok {
				return false
			}
		}
	}
	return true
}

// MaskedHost is the Host a request to port carries under mask ("" keeps
// the client's, given as host).
func MaskedHost(mask, host string, port int) string {
	if mask == "" {
		return host
	}
	return strings.ReplaceAll(mask, PortVar, strconv.Itoa(port))
}
