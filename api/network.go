package api

// Network is a sandbox's network (docs/networking.md): in a create
// request, what it asks for; in GET/PUT /v1/sandboxes/{id}/network, its
// current settings (PUT changes them live; the mode cannot change).
type Network struct {
	// Mode is "none" (loopback only) or "nat" (its own address behind
	// NAT, DNS through Kiln, egress policy, exposed ports); "" on create
	// takes the server's default.
	Mode string `json:"mode,omitempty"`
	// Egress is what happens to destinations that neither list names:
	// "allow" (default) or "deny".
	Egress string `json:"egress,omitempty"`
	// Allow and Deny hold IPv4 CIDRs, addresses and domain names (a name
	// covers its subdomains; "*.name" is the same). Allow wins over Deny.
	// A denied name does not resolve, and the addresses it resolves to
	// are blocked too. The host, link-local addresses (cloud metadata)
	// and other sandboxes are unreachable unless an Allow CIDR names them.
	Allow []string `json:"allow,omitempty"`
	Deny  []string `json:"deny,omitempty"`
	// Public lets anyone reach the sandbox's exposed ports; otherwise a
	// request needs an API key that owns the sandbox or TrafficToken.
	Public bool `json:"public,omitempty"`
	// BandwidthBytes caps each direction, bytes per second (0: none).
	BandwidthBytes int64 `json:"bandwidth_bytes,omitempty"`
	// MaxConnections caps the connections open at once (0: none).
	MaxConnections int `json:"max_connections,omitempty"`
	// MaskHost, if set, is the Host header requests to the sandbox's
	// exposed ports carry instead of the one the client used: a host or
	// host:port in which "${PORT}" stands for the port (E2B's
	// maskRequestHost).
	MaskHost string `json:"mask_host,omitempty"`

	// Address is the sandbox's own address inside (read-only).
	Address string `json:"address,omitempty"`
	// TrafficToken opens the sandbox's exposed ports when they are not
	// public: send it as E2B-Traffic-Access-Token (read-only).
	TrafficToken string `json:"traffic_token,omitempty"`
}

// NetworkUsage are a networked sandbox's traffic counters.
type NetworkUsage struct {
	SentBytes     uint64 `json:"sent_bytes"`
	ReceivedBytes uint64 `json:"received_bytes"`
	Connections   uint64 `json:"connections"` // opened since it started
	Drops         uint64 `json:"drops"`       // packets its policy or limits refused
}
