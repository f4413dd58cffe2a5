package e2b

import (
	"fmt"
	"net/http"
	"slices"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/network"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// networkConfig is E2B's SandboxNetworkConfig (create) and
// SandboxNetworkUpdateConfig (PUT /sandboxes/{id}/network). Fields Kiln
// does not act on (egress proxies, header rules, httpsPorts) are ignored.
type networkConfig struct {
	AllowOut            []string `json:"allowOut"`
	DenyOut             []string `json:"denyOut"`
	AllowPublicTraffic  *bool    `json:"allowPublicTraffic"`
	MaskRequestHost     string   `json:"maskRequestHost"`       // create only
	AllowInternetAccess *bool    `json:"allow_internet_access"` // update only
}

// everything is the CIDR E2B's denyOut uses for "all of the internet".
const everything = "0.0.0.0/0"

// networkOptions maps E2B's network settings onto Kiln's. The network's
// mode stays the server's default: without Kiln networking (mode none) a
// sandbox has no internet whatever E2B asks. Otherwise egress is open
// unless allowInternet is false or denyOut names 0.0.0.0/0, then only
// allowOut is reachable; the ports are public (E2B's default) unless
// allowPublicTraffic is false, then the traffic access token is needed;
// maskRequestHost is the Host requests to the ports carry.
func networkOptions(allowInternet *bool, n *networkConfig) *sandbox.NetworkOptions {
	if n == nil {
		n = &networkConfig{}
	}
	p := network.Policy{Egress: network.EgressAllow, Allow: n.AllowOut,
		Deny: slices.DeleteFunc(slices.Clone(n.DenyOut), func(s string) bool { return s == everything })}
	if (allowInternet != nil && !*allowInternet) || slices.Contains(n.DenyOut, everything) {
		p.Egress = network.EgressDeny
	}
	public := n.AllowPublicTraffic == nil || *n.AllowPublicTraffic
	return &sandbox.NetworkOptions{Policy: p, Public: public, MaskHost: n.MaskRequestHost}
}

// updateNetwork is PUT /sandboxes/{id}/network: the egress rules are
// replaced; whether the ports are public, and their mask host, stay.
func (h *Handler) updateNetwork(w http.ResponseWriter, r *http.Request, c Caller) error {
	var req networkConfig
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	sb, err := h.lookup(r, c)
	if err != nil {
		return err
	}
	cur, err := h.m.Network(sb.ID)
	if err != nil {
		return fmt.Errorf("reading the sandbox's network: %w", err)
	}
	if cur.Mode == sandbox.NetworkNone {
		return fmt.Errorf("sandbox %s has no network on this server (KILN_NETWORK): %w", sb.ID, errdefs.ErrFailedPrecondition)
	}
	o := networkOptions(req.AllowInternetAccess, &networkConfig{AllowOut: req.AllowOut, DenyOut: req.DenyOut})
	o.Public, o.MaskHost = cur.Public, cur.MaskHost
	if _, err := h.m.SetNetwork(r.Context(), sb.ID, *o); err != nil {
		return fmt.Errorf("updating the sandbox's network: %w", err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
