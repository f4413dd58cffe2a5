package image

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// Guard decides which addresses a pull may connect to. It is checked on
// every connection (to the registry, its token service and its blob
// storage), after name resolution, so a registry name that resolves to a
// refused address is refused too. A nil Guard allows every address.
type Guard func(netip.Addr) error

// errRefusedAddr marks a connection a Guard refused.
var errRefusedAddr = errors.New("refused address")

// ServerGuard is the Guard of pulls a server makes for its API's callers:
// it refuses the host's own loopback services (unless allowLoopback, for
// a registry the operator runs there), link-local addresses (cloud
// metadata services live at 169.254.169.254), and unspecified and
// multicast addresses. Private networks stay reachable: registries live
// there.
func ServerGuard(allowLoopback bool) Guard {
	return func(a netip.Addr) error {
		a = a.Unmap()
		switch {
		case a.IsLoopback() && allowLoopback:
			return nil
		case a.IsLoopback(), a.IsLinkLocalUnicast(), a.IsLinkLocalMulticast(), a.IsInterfaceLocalMulticast(),
			a.IsMulticast(), a.IsUnspecified():
			return fmt.Errorf("%s: %w", a, errRefusedAddr)
		}
		return nil
	}
}

// guarded is go-containerregistry's default transport, dialling only
// what g allows.
func guarded(g Guard) http.RoundTripper {
	if g == nil {
		return remote.DefaultTransport
	}
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second,
		Control: func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("%s: %w", address, errRefusedAddr)
			}
			return g(ap.Addr())
		}}
	t := remote.DefaultTransport.(*http.Transport).Clone()
	t.DialContext = d.DialContext
	return t
}
