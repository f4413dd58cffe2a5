package network

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// Egress defaults: what happens to a destination that neither list names.
const (
	EgressAllow = "allow"
	EgressDeny  = "deny"
)

// Limits on policies from callers.
const (
	maxEntries    = 256
	maxDomainLen  = 253
	maxBandwidth  = 10 << 30 // bytes/s
	maxConnsLimit = 1 << 20
)

// Policy is one sandbox's egress policy and traffic limits. Allow wins
// over Deny; Deny wins over the protected ranges (the host, link-local,
// other sandboxes: never reachable unless an Allow entry names them);
// Egress decides the rest.
type Policy struct {
	Egress string   `json:"egress"`          // EgressAllow or EgressDeny
	Allow  []string `json:"allow,omitempty"` // IPv4 CIDRs, addresses or domain names
	Deny   []string `json:"deny,omitempty"`
	// BandwidthBytes caps each direction, in bytes per second; 0 is
	// unlimited.
	BandwidthBytes int64 `json:"bandwidth_bytes,omitempty"`
	// MaxConnections caps the connections the sandbox has open at once
	// (TCP and UDP flows it started); 0 is unlimited.
	MaxConnections int `json:"max_connections,omitempty"`
}

// rules is a Policy parsed: prefixes and domain names apart.
type rules struct {
	allowNets, denyNets       []netip.Prefix
	allowDomains, denyDomains []string // lower case, no trailing dot, no "*."
}

// Validate normalises p (default egress, lower-case names) and checks it.
func (p *Policy) Validate() error {
	switch p.Egress {
	case "":
		p.Egress = EgressAllow
	case EgressAllow, EgressDeny:
	default:
		return fmt.Errorf("egress %q: want allow or deny: %w", p.Egress, errdefs.ErrInvalidArgument)
	}
	if p.BandwidthBytes < 0 || p.BandwidthBytes > maxBandwidth {
		return fmt.Errorf("bandwidth %d bytes/s outside [0, %d]: %w", p.BandwidthBytes, int64(maxBandwidth), errdefs.ErrInvalidArgument)
	}
	if p.MaxConnections < 0 || p.MaxConnections > maxConnsLimit {
		return fmt.Errorf("max connections %d outside [0, %d]: %w", p.MaxConnections, maxConnsLimit, errdefs.ErrInvalidArgument)
	}
	for _, list := range []*[]string{&p.Allow, &p.Deny} {
		if len(*list) > maxEntries {
			return fmt.Errorf("more than %d allow or deny entries: %w", maxEntries, errdefs.ErrInvalidArgument)
		}
		for i, e := range *list {
			e = strings.ToLower(strings.TrimSuffix(strings.TrimSpace(e), "."))
			if _, _, err := parseEntry(e); err != nil {
				return err
			}
			(*list)[i] = e
		}
	}
	return nil
}

func (p Policy) rules() rules {
	var r rules
	for _, e := range p.Allow {
		if n, d, err := parseEntry(e); err == nil {
			if d != "" {
				r.allowDomains = append(r.allowDomains, d)
			} else {
				r.allowNets = append(r.allowNets, n)
			}
		}
	}
	for _, e := range p.Deny {
		if n, d, err := parseEntry(e); err == nil {
			if d != "" {
				r.denyDomains = append(r.denyDomains, d)
			} else {
				r.denyNets = append(r.denyNets, n)
			}
		}
	}
	return r
}

// parseEntry reads an allow or deny entry: an IPv4 CIDR or address, or a
// domain name (optionally "*.name"), which covers its subdomains too.
func parseEntry(e string) (netip.Prefix, string, error) {
	if p, err := netip.ParsePrefix(e); err == nil {
		if !p.Addr().Is4() {
			return netip.Prefix{}, "", fmt.Errorf("entry %q: only IPv4 is supported: %w", e, errdefs.ErrInvalidArgument)
		}
		return p.Masked(), "", nil
	}
	if a, err := netip.ParseAddr(e); err == nil {
		if !a.Is4() {
			return netip.Prefix{}, "", fmt.Errorf("entry %q: only IPv4 is supported: %w", e, errdefs.ErrInvalidArgument)
		}
		return netip.PrefixFrom(a, 32), "", nil
	}
	d := strings.TrimPrefix(e, "*.")
	if !validDomain(d) {
		return netip.Prefix{}, "", fmt.Errorf("entry %q: want an IPv4 CIDR, an address or a domain name: %w", e, errdefs.ErrInvalidArgument)
	}
	return netip.Prefix{}, d, nil
}

func validDomain(d string) bool {
	if d == "" || len(d) > maxDomainLen || !strings.Contains(d, ".") {
		return false
	}
	for label := range strings.SplitSeq(d, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// matchDomain reports whether name (lower case, no trailing dot) is one of
// domains or a subdomain of one.
func matchDomain(name string, domains []string) bool {
	return slices.ContainsFunc(domains, func(d string) bool {
		return name == d || strings.HasSuffix(name, "."+d)
	})
}

// nameVerdict says whether the Kiln DNS answers a query for name, and
// whether the answer's addresses must be added to the allowed set.
func (r rules) nameVerdict(egress, name string) (answer, learn bool) {
	switch {
	case matchDomain(name, r.allowDomains):
		return true, true
	case matchDomain(name, r.denyDomains):
		return false, false
	default:
		return egress == EgressAllow, false
	}
}
